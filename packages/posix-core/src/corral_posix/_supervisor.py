"""Host side of the process supervisor and its pool of reapers (other side: ``_reaper.py``).

One supervisor process serves every :class:`SubprocessShell` of a host
process: it is started lazily, restarted if it died, re-created after a
``fork`` of the host, and exits by itself when the host closes the control
socket.  The pool keeps idle reapers per rlimits value (at most
``_MAX_IDLE`` each, most recently used first) and asks the supervisor for a
new one when none is idle; reapers idle for long exit by themselves.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Final

import anyio

from corral.provider import OperationError

from ._reaper import FLAG_HAS_CWD, IDLE, PASS, REQUEST, RLIMIT, SEQ

__all__ = ["POOL", "REAPER_IDLE_S", "Reaper", "ReaperPool", "encode_limits", "encode_request"]

_SCRIPT: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_reaper.py")
_MAX_IDLE: Final = 8
_SNDBUF: Final = 1 << 20
_FS_ENCODING: Final = sys.getfilesystemencoding()
_FS_ERRORS: Final = sys.getfilesystemencodeerrors()
REAPER_IDLE_S = 30.0
"""A reaper idle this long exits by itself (read when one is created)."""


def encode_limits(rlimits: Sequence[tuple[int, int, int]]) -> bytes:
    """The pool key and ``N`` payload for a list of ``(resource, soft, hard)``."""
    return b"".join(RLIMIT.pack(*r) for r in rlimits)


def encode_request(
    *,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    timeout_s: float,
    limit: int,
    stdin_index: int,
    cwd_index: int,
    passes: Sequence[tuple[int, int]],
) -> bytes:
    """The ``R`` message for one command (fds are referred to by index).

    Raises:
        OperationError: ``invalid_argument`` for a NUL byte or a string the
            file-system encoding cannot represent.
    """
    fields = [] if cwd is None else [cwd]
    fields += argv
    for name, value in env.items():
        fields += (name, value)
    try:
        encoded = [f.encode(_FS_ENCODING, _FS_ERRORS) for f in fields]  # os.fsencode, inlined
    except UnicodeError:
        raise OperationError(
            "command, environment or working directory is not valid text", code="invalid_argument"
        ) from None
    body = b"\0".join(encoded)
    if body.count(b"\0") != len(encoded) - 1:
        raise OperationError(
            "command, environment or working directory contains a NUL byte",
            code="invalid_argument",
        )
    header = REQUEST.pack(
        timeout_s,
        limit,
        stdin_index,
        cwd_index,
        0 if cwd is None else FLAG_HAS_CWD,
        len(passes),
        len(argv),
        len(env),
    )
    return b"".join([b"R", header, *(PASS.pack(i, t) for i, t in passes), body])


class Reaper:
    """The host's end of one pooled reaper; leased to one run at a time."""

    __slots__ = ("generation", "owner", "seq", "sock")

    def __init__(self, sock: socket.socket, generation: int) -> None:
        self.sock = sock
        self.generation = generation
        self.owner = os.getpid()
        self.seq = 0  # requests sent; the reaper counts the same way

    def kill(self, seq: int) -> None:
        """Ask the reaper to kill command number ``seq`` if it is still running."""
        if self.owner == os.getpid():
            with contextlib.suppress(OSError):
                self.sock.send(b"K" + SEQ.pack(seq), socket.MSG_NOSIGNAL)

    def close(self) -> None:
        """Drop the reaper: on EOF it kills whatever runs and exits."""
        self.sock.close()


class _Supervisor:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.owner = 0
        self.generation = 0

    def current(self) -> socket.socket | None:
        """The control socket if the supervisor is running in this process."""
        proc, sock = self.proc, self.sock
        alive = proc is not None and proc.poll() is None
        return sock if sock is not None and self.owner == os.getpid() and alive else None

    def start(self) -> socket.socket:
        """Start (or restart) the supervisor; blocking, so called from a worker thread."""
        with self.lock:
            if self.current() is not None:
                assert self.sock is not None
                return self.sock
            if self.sock is not None and self.owner == os.getpid():
                self.sock.close()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", _SCRIPT, str(theirs.fileno())],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,
                    env={"PATH": os.defpath, "LANG": "C.UTF-8"},
                    cwd="/",
                )
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            ours.setblocking(False)
            self.generation += 1
            self.proc, self.sock, self.owner = proc, ours, os.getpid()
            return ours

    def forget(self) -> None:
        """In a forked child: the parent's supervisor is not ours."""
        self.lock = threading.Lock()
        if self.sock is not None:
            # Only this process's copy: the parent's supervisor keeps running.
            self.sock.close()
        self.proc, self.sock, self.owner = None, None, 0


class ReaperPool:
    """Idle reapers per rlimits value, shared by every shell of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._supervisor = _Supervisor()
        self._idle: dict[bytes, list[Reaper]] = {}
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        for idle in self._idle.values():
            for reaper in idle:
                reaper.close()
        self._idle = {}
        self._supervisor.forget()

    def idle_count(self, limits: bytes) -> int:
        """How many reapers with these limits wait for a command."""
        with self._lock:
            return len(self._idle.get(limits, ()))

    async def acquire(self, limits: bytes, *, fresh: bool = False) -> Reaper:
        """An idle reaper with these limits, or a new one (``fresh`` forces new).

        Raises:
            OperationError: ``failed`` when the supervisor cannot be started
                or reached.
        """
        ctl = self._supervisor.current()
        if ctl is not None and not fresh:
            with self._lock:
                idle = self._idle.get(limits)
                while idle:
                    reaper = idle.pop()
                    if reaper.generation == self._supervisor.generation:
                        return reaper
                    reaper.close()
        if ctl is None:
            try:
                ctl = await anyio.to_thread.run_sync(self._supervisor.start)
            except OSError as exc:
                raise OperationError(
                    f"cannot start the process supervisor: {exc.strerror}", code="failed"
                ) from exc
        return await self._new(ctl, limits)

    async def _new(self, ctl: socket.socket, limits: bytes) -> Reaper:
        generation = self._supervisor.generation
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with contextlib.suppress(OSError):
                ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SNDBUF)
            rights = [
                (socket.SOL_SOCKET, socket.SCM_RIGHTS, theirs.fileno().to_bytes(4, sys.byteorder))
            ]
            while True:
                try:
                    ctl.sendmsg(
                        [b"N", IDLE.pack(REAPER_IDLE_S), limits], rights, socket.MSG_NOSIGNAL
                    )
                except BlockingIOError:
                    # Shared by every task and thread: poll rather than wait_writable,
                    # which admits one waiter per fd.
                    await anyio.sleep(0.001)
                except OSError as exc:
                    raise OperationError(
                        f"cannot reach the process supervisor: {exc.strerror}", code="failed"
                    ) from exc
                else:
                    break
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        return Reaper(ours, generation)

    def release(self, reaper: Reaper, limits: bytes) -> None:
        """Give back a reaper whose command ended (its whole tree is reaped)."""
        with self._lock:
            # A dead supervisor is noticed (and its reapers dropped) at the next acquire.
            if reaper.owner == os.getpid() and reaper.generation == self._supervisor.generation:
                idle = self._idle.setdefault(limits, [])
                if len(idle) < _MAX_IDLE:
                    idle.append(reaper)
                    return
        reaper.close()


POOL: Final = ReaperPool()
