"""The ``script`` module: one JavaScript snippet per call, each in a fresh isolate."""

from __future__ import annotations

import math
from typing import Final

import anyio
import attrs

from corral.provider import ExecError, ExecResult, StatelessScriptRunner

from ._engine import EnginePool, GuestRun, Ticket
from ._prelude import parse_frames, wrap

__all__ = ["LANGUAGES", "ScriptLimits", "ScriptRunner"]

LANGUAGES: Final = frozenset({"javascript"})
_MIB: Final = 1 << 20
_NOTE: Final = "\n[output truncated]\n"
_ENGINE_STDERR_CAP: Final = 64 * 1024


def _positive_int(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be a positive integer")


def _memory(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    _positive_int(_, attribute, value)
    if value < 16 * _MIB:
        raise ValueError(f"{attribute.name} must be at least 16 MiB (the engine needs it)")


def _timeout(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"{attribute.name} must be a positive number of seconds")


@attrs.frozen(kw_only=True)
class ScriptLimits:
    """Bounds of every script run.

    Attributes:
        memory_bytes: Linear memory of one isolate (the engine, its heap and
            stack); JavaScript's own allocator stops 8 MiB below it with a
            catchable ``InternalError: out of memory``.
        max_output_bytes: Cap of stdout and of stderr (each), and of the
            result's JSON text.
        max_timeout_s: Ceiling of any run's timeout, whatever the caller asks.
        max_wasm_stack_bytes: Native stack a script may use; deeper recursion
            ends the run with a ``RangeError``.
    """

    memory_bytes: int = attrs.field(default=64 * _MIB, validator=_memory)
    max_output_bytes: int = attrs.field(default=_MIB, validator=_positive_int)
    max_timeout_s: float = attrs.field(default=60.0, validator=_timeout)
    max_wasm_stack_bytes: int = attrs.field(default=512 * 1024, validator=_positive_int)


def _cap_text(text: str, cap: int, overflowed: bool) -> tuple[str, bool]:
    """At most ``cap`` UTF-8 bytes (cut on a character boundary), then a note."""
    data = text.encode()
    if len(data) <= cap and not overflowed:
        return text, False
    kept = data[:cap].decode(errors="ignore")
    return kept + _NOTE, True


class ScriptRunner(StatelessScriptRunner):
    """Runs JavaScript in a WebAssembly isolate: QuickJS-NG under wasmtime.

    A script is evaluated as global code by a fresh engine instance. Its
    *result* is the completion value of the script -- the value of its last
    expression statement, as ``eval`` defines it -- awaited when it is a
    promise, converted with ``JSON.stringify`` (``result_json``; None when
    that gives nothing, as for ``undefined`` or a function). ``console.log``,
    ``info`` and ``debug`` write a line to stdout, ``console.error`` and
    ``warn`` to stderr. An uncaught error (or a result that cannot be turned
    into JSON, such as a BigInt or a cycle) becomes ``error`` with exit code
    1; success is exit code 0; a timeout is ``timed_out`` with exit code
    None. The isolate has no file system, no network, no timers and no
    state from earlier calls.

    Args:
        pool: The compiled engines (shared by every runner of a provider).
        limits: Memory, output and time bounds.
    """

    def __init__(self, pool: EnginePool, limits: ScriptLimits) -> None:
        super().__init__(LANGUAGES, max_timeout_s=limits.max_timeout_s)
        self._pool = pool
        self._limits = limits

    async def _run_script(self, language: str, code: str, timeout_s: float) -> ExecResult:
        """Run ``code`` in a new isolate (checks and the timeout's ceiling: the base)."""
        limits = self._limits
        argv = [
            "qjs",
            f"--memory-limit={max(limits.memory_bytes - 8 * _MIB, limits.memory_bytes // 2)}",
            "-m",
            "-e",
            wrap(code, limits.max_output_bytes),
        ]
        if not self._pool.compiled:
            # Compiling takes about half a second, once per process: not the script's time.
            await anyio.to_thread.run_sync(self._pool.warm)
        ticket = Ticket()
        frames_cap = 16 * limits.max_output_bytes + 3 * limits.max_output_bytes + _MIB

        def run() -> GuestRun:
            return self._pool.run(
                argv,
                ticket=ticket,
                memory_bytes=limits.memory_bytes,
                stdout_cap=frames_cap,
                stderr_cap=_ENGINE_STDERR_CAP,
            )

        async def watchdog() -> None:
            try:
                await anyio.sleep(timeout_s)
            except anyio.get_cancelled_exc_class():
                # The run finished (a no-op then) or the caller gave up: stop it.
                ticket.interrupt(timeout=False)
                raise
            ticket.interrupt(timeout=True)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watchdog)
            try:
                guest = await anyio.to_thread.run_sync(run)
            finally:
                tg.cancel_scope.cancel()
        return self._result(guest, ticket)

    def _result(self, guest: GuestRun, ticket: Ticket) -> ExecResult:
        cap = self._limits.max_output_bytes
        frames = parse_frames(guest.stdout)
        stdout, out_cut = _cap_text(frames.stdout, cap, frames.stdout_overflow)
        engine_err = guest.stderr.decode(errors="replace")
        stderr, err_cut = _cap_text(
            frames.stderr + engine_err, cap, frames.stderr_overflow or guest.stderr_overflowed
        )
        base = ExecResult(
            exit_code=None,
            stdout=stdout,
            stderr=stderr,
            stdout_truncated=out_cut,
            stderr_truncated=err_cut,
            duration_ms=guest.duration_ms,
        )
        if guest.status == "interrupted" and not frames.finished:
            return attrs.evolve(base, timed_out=ticket.timed_out)
        if frames.finished:
            result = frames.result_json
            error = frames.error
            if result is not None and len(result.encode()) > cap:
                message = f"the result's JSON is larger than {cap} bytes"
                result, error = None, ExecError("RangeError", message, f"RangeError: {message}\n")
            return attrs.evolve(
                base, exit_code=0 if error is None else 1, result_json=result, error=error
            )
        name, message = _guest_failure(guest)
        return attrs.evolve(
            base, exit_code=1, error=ExecError(name, message, f"{name}: {message}\n")
        )


def _guest_failure(guest: GuestRun) -> tuple[str, str]:
    """An error for a run that ended without the wrapper's last word."""
    if guest.status == "stack":
        return "RangeError", "Maximum call stack size exceeded (the isolate's stack limit)"
    if guest.status == "memory":
        return "InternalError", "out of memory (the isolate's memory limit)"
    return "InternalError", guest.detail or "the engine stopped"
