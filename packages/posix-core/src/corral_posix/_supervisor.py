"""Host side of the process supervisor (see ``_reaper.py`` for the other side).

One supervisor process serves every :class:`SubprocessShell` of a host
process.  It is started lazily, restarted if it died, and re-created after a
``fork`` of the host.  It exits by itself when the host closes the control
socket (normally: when the host process exits).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Final

import anyio

from corral import OperationError

__all__ = ["Launch", "submit"]

_SCRIPT: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_reaper.py")


class Launch:
    """One command for the supervisor: the JSON request and the fds it refers to."""

    def __init__(
        self,
        *,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None,
        chan_fd: int,
        stdin_fd: int,
        stdout_fd: int,
        stderr_fd: int,
        cwd_fd: int | None,
        pass_fds: Sequence[int],
        rlimits: Sequence[tuple[int, int, int]],
    ) -> None:
        self.fds: list[int] = [chan_fd, stdin_fd, stdout_fd, stderr_fd]
        spec: dict[str, Any] = {"chan": 0, "stdin": 1, "stdout": 2, "stderr": 3, "cwd": None}
        if cwd_fd is not None:
            spec["cwd"] = len(self.fds)
            self.fds.append(cwd_fd)
        spec["pass"] = []
        for fd in pass_fds:
            spec["pass"].append([len(self.fds), fd])
            self.fds.append(fd)
        self.payload = json.dumps(
            {
                "argv": list(argv),
                "env": dict(env),
                "cwd": cwd,
                "fds": spec,
                "rlimits": [list(r) for r in rlimits],
            }
        ).encode()


class _Supervisor:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._owner = 0

    def current(self) -> socket.socket | None:
        """The control socket if the supervisor is running in this process."""
        with self._lock:
            if (
                self._sock is not None
                and self._owner == os.getpid()
                and self._proc is not None
                and self._proc.poll() is None
            ):
                return self._sock
            return None

    def start(self) -> socket.socket:
        """Start (or restart) the supervisor; blocking, so called from a worker thread."""
        with self._lock:
            if self._owner == os.getpid() and self._proc is not None and self._sock is not None:
                if self._proc.poll() is None:
                    return self._sock
                self._sock.close()
            # After a fork the old socket belongs to the parent's supervisor: leave it be.
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                with contextlib.suppress(OSError):
                    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
                self._proc = subprocess.Popen(
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
            self._sock = ours
            self._owner = os.getpid()
            return ours


_SUPERVISOR: Final = _Supervisor()


async def submit(launch: Launch) -> None:
    """Hand one command to the supervisor.

    Raises:
        OperationError: ``too_large`` when the request does not fit in one
            message; ``failed`` when the supervisor cannot be started.
    """
    sock = _SUPERVISOR.current()
    if sock is None:
        try:
            sock = await anyio.to_thread.run_sync(_SUPERVISOR.start)
        except OSError as exc:
            raise OperationError(
                f"cannot start the process supervisor: {exc.strerror}", code="failed"
            ) from exc
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(_fd_array(launch.fds)))]
    while True:
        try:
            sock.sendmsg([launch.payload], rights)
        except BlockingIOError:
            await anyio.wait_writable(sock)
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:
                raise OperationError(
                    "command and environment are too large to run", code="too_large"
                ) from None
            raise OperationError(
                f"cannot reach the process supervisor: {exc.strerror}", code="failed"
            ) from exc
        else:
            return


def _fd_array(fds: Sequence[int]) -> bytearray:
    out = bytearray()
    for fd in fds:
        out += fd.to_bytes(4, sys.byteorder)
    return out
