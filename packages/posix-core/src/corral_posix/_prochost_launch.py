"""Host side of the process-host server (other side: ``_prochost.py``).

One server process serves every :class:`~corral_posix.HostProcessManager` of
a host process: started lazily, restarted if it died, forgotten in a forked
child. It forks a process host on request; a host whose process ended goes
to its manager's :class:`IdleHosts` and serves that manager's next start
(a fresh fork is the fallback, not the rule).

One host is always asked for ahead of time and kept *ready* (connected,
waiting for its ``R``): a start hands its request straight to it and only
then asks for the next one, so the server's hand-over and fork stay off the
start's critical path (they cost about a millisecond on a loaded machine).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading
import time
import weakref
from typing import Final

from corral.provider import OperationError

__all__ = ["HOST_IDLE_S", "PROCESS_HOSTS", "IdleHosts", "ProcessHostServer"]

_SCRIPT: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_prochost.py")
_SNDBUF: Final = 1 << 20
_MAX_IDLE_HOSTS: Final = 4
HOST_IDLE_S = 30.0
"""How long a process host waits for its next process once one ended (read at each start)."""


class ProcessHostServer:
    """The lazily started server that forks a process host per background process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._owner = 0
        self._ready: socket.socket | None = None
        self._ready_lock = threading.Lock()  # held for a swap only: fine on an event loop
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._ready_lock = threading.Lock()
        if self._sock is not None:
            self._sock.close()  # only this copy: the parent's server keeps running
        if self._ready is not None:
            self._ready.close()  # the parent's ready host stays the parent's
        self._proc, self._sock, self._owner, self._ready = None, None, 0, None

    def _current(self) -> socket.socket | None:
        proc, sock = self._proc, self._sock
        alive = proc is not None and proc.poll() is None
        return sock if sock is not None and self._owner == os.getpid() and alive else None

    def _start(self) -> socket.socket:
        """Start (or restart) the server; blocking, so called from a worker thread."""
        with self._lock:
            current = self._current()
            if current is not None:
                return current
            if self._sock is not None and self._owner == os.getpid():
                self._sock.close()
            if self._proc is not None and self._owner == os.getpid():
                with contextlib.suppress(OSError):
                    self._proc.wait(timeout=0)
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
            self._proc, self._sock, self._owner = proc, ours, os.getpid()
            return ours

    def take(self) -> socket.socket:
        """A socket (non-blocking) to the ready host, else to a freshly forked one.

        Blocking (it may start the server): called from the worker thread in
        which a start prepares its request and record, so the host begins
        before the event loop hears back (see ``HostProcessManager.start``).
        Call :meth:`replenish` once the request is sent.

        Raises:
            OperationError: ``failed`` when the server cannot be started or reached.
        """
        with self._ready_lock:
            ready, self._ready = self._ready, None
        if ready is not None:
            if self._owner == os.getpid() and _waiting(ready):
                return ready
            ready.close()
        return self._ask()

    def replenish(self) -> None:
        """Ask for the next ready host (a no-op when one is already waiting; blocking).

        Raises:
            OperationError: ``failed`` when the server cannot be started or reached.
        """
        if self._ready is None:
            self._keep_ready(self._ask())

    def _ask(self) -> socket.socket:
        """Ask the server for a new process host (blocking: may start the server); its socket."""
        for attempt in range(2):
            try:
                ctl = self._current() or self._start()
            except OSError as exc:
                raise OperationError(
                    f"cannot start the process host: {exc.strerror}", code="failed"
                ) from exc
            sock = self._send_new(ctl, last=attempt == 1)
            if sock is not None:
                return sock
        raise OperationError("cannot reach the process host", code="failed")

    def _keep_ready(self, sock: socket.socket) -> None:
        with self._ready_lock:
            keep = self._ready is None
            if keep:
                self._ready = sock
        if not keep:  # another start replenished meanwhile
            sock.close()

    def _send_new(self, ctl: socket.socket, *, last: bool) -> socket.socket | None:
        """Send ``N`` with one end of a fresh socketpair; ours, or None to retry (server killed)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(OSError):
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SNDBUF)
        rights = [
            (socket.SOL_SOCKET, socket.SCM_RIGHTS, theirs.fileno().to_bytes(4, sys.byteorder))
        ]
        try:
            # The control socket is blocking and tiny messages always fit:
            # a send never waits unless the server is wedged.
            ctl.sendmsg([b"N"], rights, socket.MSG_NOSIGNAL)
        except OSError as exc:
            ours.close()
            if not last:
                with self._lock:
                    if self._proc is not None and self._owner == os.getpid():
                        with contextlib.suppress(OSError):
                            self._proc.kill()
                return None
            raise OperationError(
                f"cannot reach the process host: {exc.strerror}", code="failed"
            ) from exc
        finally:
            theirs.close()
        ours.setblocking(False)
        return ours


PROCESS_HOSTS: Final = ProcessHostServer()
"""The process-host server of this program (one per host process)."""


def _waiting(sock: socket.socket) -> bool:
    """Whether a ready host still waits for its request (nothing to read, no hang-up)."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return not poller.poll(0)


class IdleHosts:
    """Process hosts of one manager whose process ended, each waiting for the next start.

    A start sends its request to the most recently freed one instead of a
    freshly forked host: a host that ran a process before has every page the
    next spawn touches already its own, and none of the server's hand-over
    or spare forking competes with the command for the CPU. Per manager, so
    every host in it was given the same limits, root, environment policy and
    wrapper (a host takes its request's rlimits on itself, for good).

    A host is used only during the first two thirds of the idle time it was
    given (it exits at the end of it): a request can never reach a host that
    is just leaving. At most ``_MAX_IDLE_HOSTS`` wait; closing their sockets
    (on :meth:`close`, or when there are too many) makes them exit.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[tuple[float, socket.socket]] = []  # (usable until, socket), newest last
        self._closed = False
        _ALL_IDLE.add(self)

    def put(self, free_since: float, idle_s: float, sock: socket.socket) -> None:
        """Keep a host that said it is free at ``free_since`` (monotonic) and waits ``idle_s``."""
        usable_until = free_since + idle_s * 2 / 3
        extra: socket.socket | None = sock
        with self._lock:
            if not self._closed and usable_until > time.monotonic():
                self._idle.append((usable_until, sock))
                extra = self._idle.pop(0)[1] if len(self._idle) > _MAX_IDLE_HOSTS else None
        if extra is not None:
            extra.close()

    def take(self) -> socket.socket | None:
        """The most recently freed host still well within its idle time, or None."""
        now = time.monotonic()
        stale: list[socket.socket] = []
        found: socket.socket | None = None
        with self._lock:
            while self._idle and self._idle[0][0] <= now:
                stale.append(self._idle.pop(0)[1])
            if self._idle:
                found = self._idle.pop()[1]
        for sock in stale:
            sock.close()
        return found

    def close(self) -> None:
        """Let every idle host go (each exits on its socket's end); later puts close theirs."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for _until, sock in idle:
            sock.close()

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        for _until, sock in self._idle:
            sock.close()  # only this copy: the parent keeps its hosts
        self._idle = []


_ALL_IDLE: Final[weakref.WeakSet[IdleHosts]] = weakref.WeakSet()


def _idle_after_fork() -> None:
    for hosts in list(_ALL_IDLE):
        hosts._after_fork()


os.register_at_fork(after_in_child=_idle_after_fork)
