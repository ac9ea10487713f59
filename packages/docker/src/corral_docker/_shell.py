"""DockerShell: CommandChecker on the host, then ``exec`` inside the container.

On an engine that attaches exec streams (:class:`AttachingEngine`, the SDK
engine) stdin travels over the attached connection -- any size, any bytes
(the str API's lone surrogates are the bytes they escape, as on the POSIX
providers) -- and output can be watched while the command runs. An engine
without it gets stdin through an environment variable: at most 64 KiB of
text without NUL.

Every exec carries a random marker in its environment. On timeout or
cancellation a second exec kills every process of the container whose
environment holds that marker (:mod:`._execs`), so a command's whole tree
dies, including children that called ``setsid`` or were put in the
background.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal

import anyio

from corral.provider import CommandRequest, ExecResult, OperationError
from corral_posix import CommandChecker

from ._attach import AttachedExec, AttachingEngine
from ._engine import DockerEngine, ExecOutput
from ._execs import engine_errors, kill_marked
from ._options import WORKDIR

__all__ = ["DockerShell", "OutputCallback"]

OutputCallback = Callable[[Literal["stdout", "stderr"], bytes], None]
"""Called with each piece of output as it arrives (before capping)."""

MAX_STDIN_BYTES: Final = 64 * 1024

# The exec's entry point: feeds stdin from the environment (exec has no
# portable stdin over every transport), then runs the checked argv.
_CWD_SENTINEL: Final = "corral: the working directory does not exist\n"
_ENTRY: Final = (
    'cd -- "$1" 2>/dev/null || { printf %s "$CORRAL_CWD_ERR" >&2; exit 125; }; shift; '
    "unset CORRAL_CWD_ERR; "
    'if [ -n "${CORRAL_STDIN+x}" ]; then s=$CORRAL_STDIN; unset CORRAL_STDIN; '
    'printf %s "$s" | "$@"; else exec "$@" </dev/null; fi'
)

# The attached variant: stdin (when attached) is the connection itself.
_ATTACHED_ENTRY: Final = (
    'cd -- "$1" 2>/dev/null || { printf %s "$CORRAL_CWD_ERR" >&2; exit 125; }; shift; '
    'unset CORRAL_CWD_ERR; if [ "$CORRAL_NO_STDIN" = 1 ]; then unset CORRAL_NO_STDIN; '
    'exec "$@" </dev/null; fi; exec "$@"'
)


class DockerShell:
    """Runs checked commands by exec in the workspace's container.

    Args:
        engine: The engine that owns the container.
        container: Returns the id of the live container (it may be recreated).
        checker: Host-side command-policy and environment checks.
        user: ``UID:GID`` the commands run as.
        closed: Returns True once the workspace closed.
        kill_grace_s: How long the kill exec may take before giving up.
        gate: Awaited before each command (a restore holds commands back).
    """

    def __init__(
        self,
        engine: DockerEngine,
        container: Callable[[], Awaitable[str]],
        checker: CommandChecker,
        *,
        user: str,
        closed: Callable[[], bool],
        kill_grace_s: float = 10.0,
        gate: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._engine = engine
        self._container = container
        self._checker = checker
        self._user = user
        self._closed = closed
        self._kill_grace_s = kill_grace_s
        self._gate = gate

    async def run(
        self, request: CommandRequest, *, on_output: OutputCallback | None = None
    ) -> ExecResult:
        """Run one command in the container; a timeout kills its whole tree.

        Args:
            request: The command and its limits.
            on_output: Sees each piece of output as it arrives (attaching
                engines only; others call it once per stream at the end).

        Raises:
            OperationError: ``policy_denied`` from the checker, ``invalid_argument``
                for oversized stdin, ``closed`` after close, ``failed`` when the
                engine errs.
            WorkspaceEvictedError: The container is gone.
        """
        if self._closed():
            raise OperationError("the workspace is closed", code="closed")
        checked = self._checker.check_request(request)
        argv = list(checked.argv)
        cwd_parts = tuple(checked.cwd_parts)
        workdir = WORKDIR + "".join("/" + p for p in cwd_parts)
        marker = secrets.token_hex(12)
        env = {**checked.env, "CORRAL_EXEC": marker, "CORRAL_CWD_ERR": _CWD_SENTINEL}
        stdin: bytes | None = None
        attaching = isinstance(self._engine, AttachingEngine)
        if request.stdin is not None:
            stdin = _stdin_bytes(request.stdin)
            if not attaching:
                _check_env_stdin(request.stdin, stdin)
                env["CORRAL_STDIN"] = request.stdin
        if self._gate is not None:
            await self._gate()
        container_id = await self._container()
        started = time.monotonic()
        out: Any = None
        try:
            with engine_errors("docker exec failed"), anyio.move_on_after(request.timeout_s):
                out = await self._exec(
                    container_id,
                    [workdir, *argv],
                    env,
                    stdin,
                    max_output_bytes=request.max_output_bytes,
                    on_output=on_output,
                )
        finally:
            if out is None:
                await self.kill(container_id, marker)
        duration = (time.monotonic() - started) * 1000
        if out is None:
            return ExecResult(exit_code=None, timed_out=True, duration_ms=duration)
        code = out.exit_code
        if code == 125 and out.stderr == _CWD_SENTINEL.encode() and not out.stdout:
            raise OperationError(
                f"working directory {'/' + '/'.join(cwd_parts)} does not exist in the workspace",
                code="not_found",
            )
        signal = code - 128 if code is not None and 128 < code < 160 else None
        return ExecResult(
            # The contract: killed by a signal -> exit_code None, signal names it.
            exit_code=None if signal is not None else code,
            stdout=out.stdout.decode("utf-8", "replace"),
            stderr=out.stderr.decode("utf-8", "replace"),
            stdout_truncated=out.stdout_truncated,
            stderr_truncated=out.stderr_truncated,
            duration_ms=duration,
            signal=signal,
        )

    async def _exec(
        self,
        container_id: str,
        args: list[str],
        env: dict[str, str],
        stdin: bytes | None,
        *,
        max_output_bytes: int,
        on_output: OutputCallback | None,
    ) -> ExecOutput:
        if isinstance(self._engine, AttachingEngine):
            if stdin is None:
                env["CORRAL_NO_STDIN"] = "1"
            attached = await self._engine.attach_exec(
                container_id,
                ["sh", "-c", _ATTACHED_ENTRY, "corral", *args],
                env=env,
                workdir="/",
                user=self._user,
                stdin=stdin is not None,
                exit_trailer=self._engine.remote,
            )
            try:
                return await _collect(attached, stdin, max_output_bytes, on_output)
            finally:
                await attached.aclose()
        out = await self._engine.exec(
            container_id,
            ["sh", "-c", _ENTRY, "corral", *args],
            env=env,
            workdir="/",
            user=self._user,
            max_output_bytes=max_output_bytes,
        )
        if on_output is not None:
            on_output("stdout", out.stdout)
            on_output("stderr", out.stderr)
        return out

    async def kill(self, container_id: str, marker: str) -> None:
        """Kill every process of one exec (best effort, shielded; errors are swallowed)."""
        await kill_marked(
            self._engine, container_id, [marker], user=self._user, wait_s=self._kill_grace_s
        )


def _stdin_bytes(text: str) -> bytes:
    """The bytes ``text`` stands for: UTF-8, with escaped bytes (U+DC80-U+DCFF) restored."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise OperationError(
            f"stdin has a lone surrogate at index {exc.start} that stands for no byte",
            code="invalid_argument",
        ) from None


def _check_env_stdin(text: str, data: bytes) -> None:
    """Refuse what an environment variable cannot carry (engines that cannot attach)."""
    if len(data) > MAX_STDIN_BYTES:
        raise OperationError(
            f"stdin is larger than {MAX_STDIN_BYTES} bytes (this Docker engine adapter "
            "cannot attach stdin)",
            code="invalid_argument",
        )
    if "\0" in text or len(data) != len(text.encode("utf-8", "replace")):
        raise OperationError(
            "stdin must be text without NUL bytes (this Docker engine adapter cannot attach stdin)",
            code="invalid_argument",
        )


class _Capped:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.truncated = False

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[: max(room, 0)]
        self.data += chunk


async def _collect(
    attached: AttachedExec,
    stdin: bytes | None,
    max_output_bytes: int,
    on_output: OutputCallback | None,
) -> ExecOutput:
    """Feed stdin while reading (capped) output until the exec ends."""
    out, err = _Capped(max_output_bytes), _Capped(max_output_bytes)

    async def feed(data: bytes) -> None:
        # A command that exits without reading all of stdin is not an error
        # (as with a pipe on the POSIX providers).
        if await attached.send(data):
            await attached.close_stdin()

    async with anyio.create_task_group() as tg:
        if stdin is not None:
            tg.start_soon(feed, stdin)
        while (chunks := await attached.receive()) is not None:
            for name, data in chunks:
                (out if name == "stdout" else err).add(data)
                if on_output is not None:
                    on_output(name, data)
        tg.cancel_scope.cancel()
    return ExecOutput(
        exit_code=await attached.exit_code(),
        stdout=bytes(out.data),
        stderr=bytes(err.data),
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
    )
