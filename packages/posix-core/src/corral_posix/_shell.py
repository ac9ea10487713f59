"""SubprocessShell: guarded commands run as host subprocesses, trees killed."""

from __future__ import annotations

import errno
import os
import resource
import socket
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import anyio
import attrs

from corral.provider import CommandRequest, ExecResult, OperationError, WorkspaceEvictedError

from ._capture import Capture, feed, write_now
from ._checker import CommandChecker
from ._env import StartEnvironment
from ._reaper import FINAL, FLAG_RETIRE, FLAG_TIMED_OUT, KIND_ERRNO
from ._supervisor import POOL, Reaper, encode_limits, encode_request
from ._wrapper import IDENTITY_WRAPPER, CommandWrapper, WrappedCommand, wrap_guarded

__all__ = ["ProcessLimits", "SubprocessShell"]

_KILL_WAIT_S: Final = 15.0
_ATTEMPTS: Final = 3
_RECV_BYTES: Final = (1 << 16) + 64


def _at_least(minimum: int) -> Callable[[Any, attrs.Attribute[Any], int | None], None]:
    def check(_inst: Any, attr: attrs.Attribute[Any], value: int | None) -> None:
        if value is not None and value < minimum:
            raise ValueError(f"{attr.name} must be at least {minimum}")

    return check


@attrs.frozen(kw_only=True)
class ProcessLimits:
    """rlimits applied to each command (``None`` leaves a limit as inherited).

    Limits can only be lowered: a value above the host's hard limit is
    clamped to it.  ``address_space_bytes`` is off by default because Go,
    Java, Node and sanitizer builds reserve far more virtual memory than they
    use; ``RLIMIT_NPROC`` is not offered because it counts every process of
    the user, not of the command.

    Attributes:
        cpu_s: CPU seconds (``SIGXCPU`` at the limit, ``SIGKILL`` a second later).
        address_space_bytes: Virtual memory (at least 256 MiB).
        file_size_bytes: Largest file a command may write (1 GiB by default).
        open_files: Open file descriptors (at least 16; 1024 by default).
        core: Core dump size; 0 (no core dumps) by default.
    """

    cpu_s: int | None = attrs.field(default=None, validator=_at_least(1))
    address_space_bytes: int | None = attrs.field(default=None, validator=_at_least(256 << 20))
    file_size_bytes: int | None = attrs.field(default=1 << 30, validator=_at_least(0))
    open_files: int | None = attrs.field(default=1024, validator=_at_least(16))
    core: int | None = attrs.field(default=0, validator=_at_least(0))

    def rlimits(self) -> list[tuple[int, int, int]]:
        """``(resource, soft, hard)`` triples, clamped to this process's hard limits."""
        wanted = [
            (resource.RLIMIT_CPU, self.cpu_s, 1),
            (resource.RLIMIT_AS, self.address_space_bytes, 0),
            (resource.RLIMIT_FSIZE, self.file_size_bytes, 0),
            (resource.RLIMIT_NOFILE, self.open_files, 0),
            (resource.RLIMIT_CORE, self.core, 0),
        ]
        out = []
        for res, value, slack in wanted:
            if value is None:
                continue
            _soft, hard = resource.getrlimit(res)

            def clamp(v: int, hard: int = hard) -> int:
                return v if hard == resource.RLIM_INFINITY else min(v, hard)

            out.append((res, clamp(value), clamp(value + slack)))
        return out


class SubprocessShell:
    """Runs guarded commands as subprocesses of pooled reaper processes.

    Each command gets: the argv the :class:`CommandChecker` approved (no shell
    unless the policy allows shell syntax), re-shaped by the
    :class:`CommandWrapper`; a minimal environment (``PATH``, ``HOME`` = the
    workspace root, ``LANG=C.UTF-8``, ``TMPDIR``, then ``base_env``, then the
    request's variables that passed the denylist); stdin from the request or
    ``/dev/null``; its own session, so no controlling terminal; the working
    directory opened beneath the root and entered by fd; rlimits.  When the
    command's main process exits, times out or the caller is cancelled,
    every process it started is killed before ``run`` returns -- including
    ones that called ``setsid`` and double-forked (see ``_reaper.py``).

    Args:
        root: Host path of the workspace root.
        checker: Checks every request against the command policy (a default
            :class:`CommandChecker` if omitted).
        wrapper: Re-shapes the guarded argv (e.g. under bwrap); identity by default.
        base_env: Operator-trusted variables added to every command (not
            checked against the denylist).
        limits: rlimits for every command.
        provider_id: Named in :class:`corral.WorkspaceEvictedError`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        checker: CommandChecker | None = None,
        wrapper: CommandWrapper | None = None,
        base_env: Mapping[str, str] | None = None,
        limits: ProcessLimits | None = None,
        provider_id: str | None = None,
    ) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.checker = checker or CommandChecker()
        self.wrapper = wrapper or IDENTITY_WRAPPER
        self._env = StartEnvironment(self.root, base_env or {})
        self._limits_key = encode_limits((limits or ProcessLimits()).rlimits())
        self._provider_id = provider_id
        self._active: dict[Reaper, int] = {}
        self._closed = False

    async def run(self, request: CommandRequest) -> ExecResult:
        """Run one command; see the class docstring for what it gets.

        Returns:
            Exit code or signal, captured output (each stream capped at
            ``max_output_bytes`` with a truncation marker), duration, and
            ``timed_out=True`` (``exit_code=None``) when the timeout fired.

        Raises:
            OperationError: ``policy_denied`` and the other guard codes;
                ``not_found``/``not_a_directory``/``invalid_path`` for the
                cwd; ``closed`` after :meth:`aclose`; ``failed`` when the
                reaper running the command was killed.
            WorkspaceEvictedError: The workspace root no longer exists.
        """
        if self._closed:
            raise OperationError("the shell is closed", code="closed")
        root_fd = self._open_root()
        try:
            guarded = self.checker.check_request(request, root_fd=root_fd)
        finally:
            os.close(root_fd)
        assert guarded.cwd_fd is not None
        fds = _FdSet([guarded.cwd_fd])
        try:
            wrapped = wrap_guarded(
                self.wrapper,
                guarded.argv,
                root=self.root,
                cwd_fd=guarded.cwd_fd,
                cwd_parts=guarded.cwd_parts,
                env={**self._env.get(), **guarded.env},
            )
            return await self._launch(request, wrapped, guarded.cwd_fd, fds)
        finally:
            fds.close_all()

    async def _launch(
        self, request: CommandRequest, wrapped: WrappedCommand, cwd_fd: int, fds: _FdSet
    ) -> ExecResult:
        passed = [cwd_fd]
        stdin_index = -1
        pending = b""
        in_w = -1
        if request.stdin is not None:
            in_r, in_w = fds.pipe()
            os.set_blocking(in_w, False)
            try:
                data = request.stdin.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:  # a lone surrogate that stands for no byte
                raise OperationError(
                    "stdin is not valid text (a lone surrogate)", code="invalid_argument"
                ) from None
            # Most stdin fits in the pipe: no feeder task, and EOF right away.
            pending = data[write_now(in_w, data) :]
            if not pending:
                fds.close(in_w)
            stdin_index = len(passed)
            passed.append(in_r)
        passes = [(len(passed) + i, target) for i, target in enumerate(wrapped.pass_fds)]
        passed += wrapped.pass_fds
        payload = encode_request(
            argv=wrapped.argv,
            env=wrapped.env,
            cwd=wrapped.cwd,
            timeout_s=request.timeout_s,
            limit=request.max_output_bytes,
            stdin_index=stdin_index,
            cwd_index=0,
            passes=passes,
        )
        rights = _fd_array(passed)
        out, err = Capture(request.max_output_bytes), Capture(request.max_output_bytes)
        started = time.perf_counter()
        if pending:
            async with anyio.create_task_group() as tg:
                tg.start_soon(feed, in_w, pending, lambda: fds.close(in_w))
                final = await self._execute(payload, rights, out, err)
                tg.cancel_scope.cancel()
        else:
            final = await self._execute(payload, rights, out, err)
        duration_ms = (time.perf_counter() - started) * 1000.0
        return _result(
            final,
            program=wrapped.argv[0],
            out=out,
            err=err,
            duration_ms=duration_ms,
            signal_as_status=wrapped.signal_as_status,
        )

    async def _execute(self, payload: bytes, rights: bytes, out: Capture, err: Capture) -> bytes:
        """Run the request on a pooled reaper; return its ``X`` message."""
        for attempt in range(_ATTEMPTS):
            reaper = await POOL.acquire(self._limits_key, fresh=attempt == _ATTEMPTS - 1)
            try:
                sent = await _send(reaper, payload, rights)
            except BaseException:
                reaper.close()
                raise
            if not sent:
                reaper.close()  # it exited while idle: the command never started
                continue
            final = await self._collect(reaper, out, err)
            if final == b"Q":
                continue
            return final
        raise OperationError("no process reaper accepted the command", code="failed")

    async def _collect(self, reaper: Reaper, out: Capture, err: Capture) -> bytes:
        final = b""
        seq = reaper.seq
        self._active[reaper] = seq
        try:
            # No host-side timer: the reaper enforces the timeout itself (a
            # cancel scope per run costs 10-40 us), and a dead one reads as EOF.
            final = await _messages(reaper, out, err)
        finally:
            if not final:
                # Cancelled (or the reaper died): have it kill the tree and
                # wait, bounded, until it reports that it is done.
                with anyio.CancelScope(shield=True), anyio.move_on_after(_KILL_WAIT_S):
                    reaper.kill(seq)
                    final = await _messages(reaper, out, err)
            self._active.pop(reaper, None)
            if final[:1] == b"X" and not final[-1] & FLAG_RETIRE:
                POOL.release(reaper, self._limits_key)
            else:
                reaper.close()
        return final

    def _open_root(self) -> int:
        try:
            return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise WorkspaceEvictedError(
                "the workspace directory no longer exists", provider_id=self._provider_id
            ) from None

    async def aclose(self) -> None:
        """Kill every running command and refuse later runs. Idempotent."""
        self._closed = True
        for reaper, seq in list(self._active.items()):
            reaper.kill(seq)
        with anyio.move_on_after(_KILL_WAIT_S):
            # Runs may live on other event loops or threads, so no loop-bound Event.
            while self._active:  # noqa: ASYNC110
                await anyio.sleep(0.005)


class _FdSet:
    """Fds a run owns; each is closed exactly once."""

    def __init__(self, fds: list[int]) -> None:
        self._open = set(fds)

    def pipe(self) -> tuple[int, int]:
        r, w = os.pipe2(os.O_CLOEXEC)
        self._open.update((r, w))
        return r, w

    def close(self, fd: int) -> None:
        if fd in self._open:
            self._open.discard(fd)
            os.close(fd)

    def close_all(self) -> None:
        for fd in list(self._open):
            self.close(fd)


def _fd_array(fds: list[int]) -> bytes:
    return struct.pack(f"{len(fds)}i", *fds)


async def _send(reaper: Reaper, payload: bytes, rights: bytes) -> bool:
    """Send a request; False if the reaper is gone (so the command never started)."""
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)]
    while True:
        try:
            reaper.sock.sendmsg([payload], ancillary, socket.MSG_NOSIGNAL)
        except BlockingIOError:
            await anyio.wait_writable(reaper.sock)
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:
                raise OperationError(
                    "command and environment are too large to run", code="too_large"
                ) from None
            return False
        else:
            reaper.seq += 1
            return True


async def _messages(reaper: Reaper, out: Capture, err: Capture) -> bytes:
    """Collect output until the reaper's ``X`` (or ``Q``); ``b""`` if it died."""
    sock = reaper.sock
    while True:
        try:
            message = sock.recv(_RECV_BYTES)
        except BlockingIOError:
            await anyio.wait_readable(sock)
            continue
        except OSError:
            return b""
        tag = message[:1]
        if tag == b"1":
            out.add(message[1:])
        elif tag == b"2":
            err.add(message[1:])
        else:
            return message


def _result(
    final: bytes,
    *,
    program: str,
    out: Capture,
    err: Capture,
    duration_ms: float,
    signal_as_status: bool = False,
) -> ExecResult:
    if not final:
        raise OperationError("the command's reaper process was killed", code="failed")
    kind, value, out_dropped, err_dropped, flags = FINAL.unpack_from(final, 1)
    out.discarded += out_dropped
    err.discarded += err_dropped
    timed_out = bool(flags & FLAG_TIMED_OUT)
    exit_code: int | None
    signal_number: int | None = None
    if kind == KIND_ERRNO:
        exit_code = 127 if value == errno.ENOENT else 126
        why = (
            "command not found"
            if value == errno.ENOENT
            else f"cannot execute: {os.strerror(value)}"
        )
        err.add(f"{program}: {why}\n".encode())
    else:
        decoded = os.waitstatus_to_exitcode(value)
        exit_code, signal_number = (decoded, None) if decoded >= 0 else (None, -decoded)
        if signal_as_status and exit_code is not None and 128 < exit_code < 160:
            signal_number, exit_code = exit_code - 128, None
    if timed_out:
        exit_code = None
    return ExecResult(
        exit_code=exit_code,
        stdout=out.text(),
        stderr=err.text(),
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        duration_ms=duration_ms,
        signal=signal_number,
        timed_out=timed_out,
    )
