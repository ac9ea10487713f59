"""The host side of a ``script`` run in a fresh box: one runner, many kinds of box.

local-sandbox (a bubblewrap box) and docker (a container) run each script
the same way: the driver of :mod:`corral_posix._scriptdriver` is fed to a
real interpreter in a box that sees nothing of the workspace, and the
box's output plus the driver's frame become the result. Only "start a
fresh box, feed it the program, give me its streams" differs, so a
provider subclasses :class:`BoxScriptRunner` and implements
:meth:`BoxScriptRunner._run_box`; the checks (from
:class:`corral.provider.StatelessScriptRunner`), the caps and the reading of
a result -- timeout, frame, out of memory, killed, or an interpreter that
died early -- are decided here once.
"""

from __future__ import annotations

import abc
from typing import Any, Final

import attrs

from corral.provider import ExecError, ExecResult, StatelessScriptRunner

from ._scriptdriver import ScriptFrame, ScriptProgram, make_program

__all__ = ["BoxRun", "BoxScriptRunner", "frame_cap"]

_MIB: Final = 1 << 20
_FRAME_SLACK: Final = 64 * 1024
_FRAME_GROWTH: Final = 7
"""A frame is at most this many times the result's bytes (JSON escapes of JSON text)."""


def frame_cap(result_cap: int) -> int:
    """The most bytes a driver's frame can take for a result of ``result_cap`` bytes."""
    return _FRAME_GROWTH * result_cap + _FRAME_SLACK


@attrs.frozen
class BoxRun:
    """What one box reported.

    Attributes:
        result: The box seen as a command: its capped stdout and stderr
            (the frame taken out), truncation flags, duration, exit code,
            the signal that killed the interpreter, and ``timed_out``.
        frame: The driver's frame, when it wrote a whole one.
        oom: Whether the kernel killed a process of the box for memory.
    """

    result: ExecResult
    frame: ScriptFrame | None
    oom: bool = False


class BoxScriptRunner(StatelessScriptRunner):
    """A ``script`` module that runs each call in a fresh box.

    Results follow :mod:`corral_posix._scriptdriver` (the isolate's
    contract: stdout/stderr as written, the last expression's value as
    JSON, uncaught errors with name, value and traceback; a timeout is
    ``timed_out`` with exit code None). A box the kernel killed for memory
    reports a ``MemoryError``; an interpreter killed before it reported a
    ``Killed`` error with its signal; one that exited early an
    ``InterpreterError``. Every result has ``state="fresh"``.

    Args:
        languages: The languages whose interpreter the box has.
        box: How the box is made, for ``describe()``.
        missing: What a language error says when there is no interpreter.
        max_output_bytes: Cap of stdout, of stderr and of the result's JSON.
        max_timeout_s: Ceiling of a run's timeout.
        memory_bytes: The box's memory limit, named by a ``MemoryError``.
        sigkill_note: Added to a ``Killed`` error for SIGKILL (the likely cause).
    """

    def __init__(
        self,
        languages: frozenset[str],
        *,
        box: str,
        missing: str,
        max_output_bytes: int = _MIB,
        max_timeout_s: float = 60.0,
        memory_bytes: int | None = None,
        sigkill_note: str = "",
    ) -> None:
        super().__init__(languages, max_timeout_s=max_timeout_s, missing=missing)
        self._box = box
        self._cap = max_output_bytes
        self._memory = memory_bytes
        self._sigkill_note = sigkill_note

    def details(self) -> dict[str, Any]:
        """Facts for ``describe()``."""
        return {
            "script_languages": sorted(self.languages),
            "script_box": self._box,
            "script_max_timeout_s": self.max_timeout_s,
            "script_max_output_bytes": self._cap,
        }

    def _program(self, language: str, code: str, *, channel_fd: int) -> ScriptProgram:
        """The driver of ``code``, writing its frame to ``channel_fd`` inside the box."""
        return make_program(language, code, channel_fd=channel_fd, result_cap=self._cap)

    async def _run_script(self, language: str, code: str, timeout_s: float) -> ExecResult:
        return self._finish(await self._run_box(language, code, timeout_s))

    @abc.abstractmethod
    async def _run_box(self, language: str, code: str, timeout_s: float) -> BoxRun:
        """Run ``code`` (a checked language) in a fresh box, at most ``timeout_s``.

        Build the program with :meth:`_program`; cap each stream at
        ``self._cap`` bytes.
        """

    def _finish(self, run: BoxRun) -> ExecResult:
        """The box's view plus the driver's frame, as a script result."""
        result, frame = run.result, run.frame
        base = attrs.evolve(result, state="fresh")
        if result.timed_out:
            return attrs.evolve(base, exit_code=None)
        if frame is not None and not run.oom:
            return attrs.evolve(
                base,
                exit_code=0 if frame.error is None else 1,
                result_json=frame.result_json,
                error=frame.error,
            )
        if run.oom:
            limit = f" of {self._memory} bytes" if self._memory else ""
            message = f"the script ran out of memory (the box's limit{limit}); the kernel killed it"
            return attrs.evolve(base, error=_error("MemoryError", message))
        if result.signal is not None:
            message = f"the script's interpreter was killed by signal {result.signal}" + (
                self._sigkill_note if result.signal == 9 else ""
            )
            return attrs.evolve(base, error=_error("Killed", message))
        status = result.exit_code
        message = f"the interpreter exited with status {status} before the script finished"
        return attrs.evolve(
            base,
            exit_code=1 if status in (0, None) else status,
            error=_error("InterpreterError", message),
        )


def _error(name: str, message: str) -> ExecError:
    return ExecError(name, message, f"{name}: {message}\n")
