"""SubprocessShell: guarded commands run as host subprocesses, trees killed."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import anyio
import attrs

from corral import CommandRequest, ExecResult, OperationError, WorkspaceEvictedError

from ._capture import Capture, drain, feed
from ._env import base_environment
from ._guard import ShellGuard
from ._supervisor import Launch, submit
from ._wrapper import IDENTITY_WRAPPER, CommandWrapper, WrapContext, WrappedCommand

__all__ = ["ResourceLimits", "SubprocessShell"]

_KILL_WAIT_S: Final = 15.0
_DRAIN_GRACE_S: Final = 2.0


def _at_least(minimum: int) -> Callable[[Any, attrs.Attribute[Any], int | None], None]:
    def check(_inst: Any, attr: attrs.Attribute[Any], value: int | None) -> None:
        if value is not None and value < minimum:
            raise ValueError(f"{attr.name} must be at least {minimum}")

    return check


@attrs.frozen(kw_only=True)
class ResourceLimits:
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
    """Runs guarded commands as subprocesses of a per-process supervisor.

    Each command gets: the argv the :class:`ShellGuard` approved (no shell
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
        guard: Policy checks (a default :class:`ShellGuard` if omitted).
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
        guard: ShellGuard | None = None,
        wrapper: CommandWrapper | None = None,
        base_env: Mapping[str, str] | None = None,
        limits: ResourceLimits | None = None,
        provider_id: str | None = None,
    ) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.guard = guard or ShellGuard()
        self.wrapper = wrapper or IDENTITY_WRAPPER
        self._base_env = dict(base_env or {})
        self._rlimits = (limits or ResourceLimits()).rlimits()
        self._provider_id = provider_id
        self._active: set[socket.socket] = set()
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
                cwd; ``closed`` after :meth:`aclose`.
            WorkspaceEvictedError: The workspace root no longer exists.
        """
        if self._closed:
            raise OperationError("the shell is closed", code="closed")
        root_fd = self._open_root()
        try:
            guarded = self.guard.check_request(request, root_fd=root_fd)
        finally:
            os.close(root_fd)
        assert guarded.cwd_fd is not None
        fds = _FdSet([guarded.cwd_fd])
        try:
            host_cwd = _fd_path(guarded.cwd_fd) or os.path.join(self.root, *guarded.cwd_parts)
            env = {**base_environment(self.root), **self._base_env, **guarded.env}
            wrapped = self.wrapper.wrap(guarded.argv, WrapContext(self.root, host_cwd, env))
            return await self._launch(request, wrapped, guarded.cwd_fd, fds)
        finally:
            fds.close_all()

    async def _launch(
        self, request: CommandRequest, wrapped: WrappedCommand, cwd_fd: int, fds: _FdSet
    ) -> ExecResult:
        chan, chan_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        out_r, out_w = fds.pipe()
        err_r, err_w = fds.pipe()
        in_w: int | None = None
        if request.stdin is None:
            in_r = fds.add(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        else:
            in_r, in_w = fds.pipe()
            os.set_blocking(in_w, False)
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
        chan.setblocking(False)
        launch = Launch(
            argv=wrapped.argv,
            env=wrapped.env,
            cwd=wrapped.cwd,
            chan_fd=chan_child.fileno(),
            stdin_fd=in_r,
            stdout_fd=out_w,
            stderr_fd=err_w,
            cwd_fd=cwd_fd,
            pass_fds=wrapped.pass_fds,
            rlimits=self._rlimits,
        )
        started = time.perf_counter()
        try:
            await submit(launch)
        except BaseException:
            chan.close()
            raise
        finally:
            chan_child.close()
            for fd in (in_r, out_w, err_w, cwd_fd):
                fds.close(fd)
        out, err = Capture(request.max_output_bytes), Capture(request.max_output_bytes)
        status: bytes | None = None
        timed_out = False
        self._active.add(chan)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(drain, out_r, out)
                tg.start_soon(drain, err_r, err)
                if in_w is not None:
                    stdin = (request.stdin or "").encode("utf-8", "surrogateescape")
                    tg.start_soon(feed, in_w, stdin, lambda: fds.close(in_w))
                with anyio.move_on_after(request.timeout_s):
                    status = await _receive(chan)
                if status is None:
                    timed_out = True
                    status = await _kill(chan)
                # Every writer is dead now; a leaked copy of a pipe must not hang us.
                tg.cancel_scope.deadline = anyio.current_time() + _DRAIN_GRACE_S
        finally:
            if status is None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(_KILL_WAIT_S):
                    await _kill(chan)
            self._active.discard(chan)
            chan.close()
        duration_ms = (time.perf_counter() - started) * 1000.0
        assert status is not None
        return _result(
            status,
            program=wrapped.argv[0],
            out=out,
            err=err,
            duration_ms=duration_ms,
            timed_out=timed_out,
        )

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
        for chan in list(self._active):
            with contextlib.suppress(OSError):
                chan.send(b"K")
        with anyio.move_on_after(_KILL_WAIT_S):
            # Runs may live on other event loops or threads, so no loop-bound Event.
            while self._active:  # noqa: ASYNC110
                await anyio.sleep(0.005)


class _FdSet:
    """Fds a run owns; each is closed exactly once."""

    def __init__(self, fds: list[int]) -> None:
        self._open = set(fds)

    def add(self, fd: int) -> int:
        self._open.add(fd)
        return fd

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


def _fd_path(fd: int) -> str | None:
    with contextlib.suppress(OSError):
        return os.readlink(f"/proc/self/fd/{fd}")
    return None


async def _receive(chan: socket.socket) -> bytes:
    while True:
        try:
            return chan.recv(64)
        except BlockingIOError:
            await anyio.wait_readable(chan)
        except ConnectionResetError:
            return b""


async def _kill(chan: socket.socket) -> bytes:
    with contextlib.suppress(OSError):
        chan.send(b"K")
    return await _receive(chan)


def _result(
    status: bytes,
    *,
    program: str,
    out: Capture,
    err: Capture,
    duration_ms: float,
    timed_out: bool,
) -> ExecResult:
    if not status:
        raise OperationError("the command's supervisor process was killed", code="failed")
    exit_code: int | None
    signal_number: int | None = None
    if status.startswith(b"E"):
        code = int(status[1:])
        exit_code = 127 if code == errno.ENOENT else 126
        why = (
            "command not found" if code == errno.ENOENT else f"cannot execute: {os.strerror(code)}"
        )
        err.add(f"{program}: {why}\n".encode())
    else:
        decoded = os.waitstatus_to_exitcode(int(status[1:]))
        exit_code, signal_number = (decoded, None) if decoded >= 0 else (None, -decoded)
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
