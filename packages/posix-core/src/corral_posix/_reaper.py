"""The process supervisor: a small helper process that starts and kills commands.

This file runs as a script (``python -I -S _reaper.py CTL_FD``) and imports
only the standard library, so it starts without the embedding application's
site-packages and never touches the application's process state.

Process tree::

    host Python  --ctl socket-->  supervisor (child subreaper, one per host process)
                                    +-- reaper (child subreaper, one per command)
                                          +-- command (own session and process group)
                                                +-- ... every descendant

The host sends one SEQPACKET message per command on the control socket: a
JSON request plus, as SCM_RIGHTS, a per-command channel socket, the stdio
fds, the working-directory fd and the wrapper's extra fds.  The supervisor
forks a reaper for it (a fork of a small, single-threaded interpreter, not a
new interpreter).  The reaper marks itself a child subreaper, so every
process the command starts -- including ones that call ``setsid`` and
double-fork -- is re-parented to it instead of to init when its own parent
exits.  When the command's main process exits, or the host writes ``K`` (or
closes the channel: timeout, cancellation, host death), the reaper kills its
whole subtree and reaps it until it has no children left, and only then
reports ``X<wait status>``.  Because it only ever signals its own unreaped
children, a recycled pid can never be hit.

The supervisor is itself a subreaper: if a command kills its reaper, the
orphans land on the supervisor, which kills every child that is not one of
its reapers.  None of this is a security boundary against a hostile command
running as the same user (it can kill the supervisor first); it makes
"after a command returns, nothing it started keeps running" hold for
ordinary and careless commands.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import resource
import select
import signal
import socket
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36
_MAX_MESSAGE = 1 << 20
_MAX_FDS = 250
_RESET_SIGNALS = tuple(
    s
    for s in (
        signal.SIGPIPE,
        signal.SIGXFSZ,
        signal.SIGCHLD,
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGALRM,
    )
)


def _set_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0


def _children() -> list[int]:
    """Direct children of this (single-threaded) process, zombies included."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children", "rb") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        pass
    found = []
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            # The comm field may hold spaces and parentheses: split after the last ')'.
            fields = stat[stat.rfind(b")") + 2 :].split()
            if len(fields) > 1 and int(fields[1]) == me:
                found.append(int(name))
    return found


def _wakeup_pipe() -> int:
    """A pipe that becomes readable on SIGCHLD (the write end is set as wakeup fd)."""
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    return r


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass


def _which(name: str, path: str | None) -> str:
    if "/" in name:
        return name
    for entry in (path or "").split(":"):
        if not entry.startswith("/"):
            continue
        candidate = os.path.join(entry, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(errno.ENOENT, "command not found", name)


def _spawn(req: dict, fds: list[int]) -> int:  # type: ignore[type-arg]
    """Start the command in its own session; the reaper is dedicated, so it
    changes its own cwd and rlimits, which posix_spawn's child inherits."""
    spec = req["fds"]
    path = _which(req["argv"][0], req["env"].get("PATH"))
    if req.get("cwd") is not None:
        os.chdir(req["cwd"])
    elif spec.get("cwd") is not None:
        os.fchdir(fds[spec["cwd"]])
    targets = [(spec["stdin"], 0), (spec["stdout"], 1), (spec["stderr"], 2)]
    targets += [(idx, target) for idx, target in spec.get("pass", ())]
    # Move every source above every target so no dup2 clobbers a later
    # source and no dup2 is a same-number no-op that would keep CLOEXEC.
    # Stay low: glibc refuses a file action on an fd above RLIMIT_NOFILE.
    base = max([3] + [t + 1 for _, t in targets])
    actions = []
    for idx, target in targets:
        actions.append((os.POSIX_SPAWN_DUP2, _dup_above(fds[idx], base), target))
    for res, soft, hard in req.get("rlimits", ()):
        resource.setrlimit(res, (soft, hard))
    return os.posix_spawn(
        path,
        req["argv"],
        req["env"],
        file_actions=actions,
        setsid=True,
        setsigdef=_RESET_SIGNALS,
        setsigmask=(),
    )


def _dup_above(fd: int, base: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, base)


def _kill_tree(main: int, subreaper: bool) -> int:
    """Kill the command and every descendant; return the main process's wait status."""
    status: int | None = None
    # The main process is not reaped yet, so its process-group id cannot be recycled.
    with contextlib.suppress(OSError):
        os.killpg(main, signal.SIGKILL)
    delay = 0.0005
    while True:
        if subreaper:
            for child in _children():
                with contextlib.suppress(OSError):
                    os.kill(child, signal.SIGKILL)
        try:
            while True:
                pid, st = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                if pid == main:
                    status = st
        except ChildProcessError:
            break
        if not subreaper and status is not None:
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
    return status if status is not None else signal.SIGKILL


def _reaper(data: bytes, fds: list[int]) -> None:
    subreaper = _set_subreaper()
    req = json.loads(data)
    chan = socket.socket(fileno=fds[req["fds"]["chan"]])
    wake = _wakeup_pipe()
    try:
        main = _spawn(req, fds)
    except OSError as exc:
        chan.send(b"E%d" % (exc.errno or errno.EIO))
        return
    finally:
        for i, fd in enumerate(fds):
            if i != req["fds"]["chan"]:
                with contextlib.suppress(OSError):
                    os.close(fd)
    poller = select.poll()
    poller.register(chan.fileno(), select.POLLIN)
    poller.register(wake, select.POLLIN)
    while True:
        ready = {fd for fd, _ in poller.poll()}
        if chan.fileno() in ready:
            # "K", or EOF because the host gave up: kill now.  The request is
            # consumed so closing later does not reset the host's end.
            with contextlib.suppress(OSError):
                chan.recv(16)
            break
        _drain(wake)
        info = os.waitid(os.P_PID, main, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is not None and info.si_pid == main:
            break
        # Reap exited orphans as we go so a long command cannot pile up zombies.
        for child in _children() if subreaper else ():
            if child != main:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(child, os.WNOHANG)
    status = _kill_tree(main, subreaper)
    with contextlib.suppress(OSError):
        chan.send(b"X%d" % status)


def _supervise(ctl_fd: int) -> None:
    ctl = socket.socket(fileno=ctl_fd)
    _set_subreaper()
    wake = _wakeup_pipe()
    reapers: set[int] = set()
    poller = select.poll()
    poller.register(ctl.fileno(), select.POLLIN)
    poller.register(wake, select.POLLIN)
    while True:
        for fd, ev in poller.poll():
            if fd == wake:
                _drain(wake)
                _reap(reapers)
                continue
            if not ev & select.POLLIN:
                return
            data, anc, _flags, _addr = ctl.recvmsg(
                _MAX_MESSAGE, socket.CMSG_SPACE(_MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
            )
            fds = _fds_of(anc)
            if not data:
                return
            pid = os.fork()
            if pid == 0:
                _run_reaper(ctl, wake, data, fds)
            reapers.add(pid)
            for received in fds:
                os.close(received)


def _run_reaper(ctl: socket.socket, wake: int, data: bytes, fds: list[int]) -> None:
    code = 0
    try:
        ctl.close()
        os.close(wake)
        _reaper(data, fds)
    except BaseException:
        code = 70
    finally:
        os._exit(code)


def _reap(reapers: set[int]) -> None:
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            reapers.discard(pid)
    # Orphans of a reaper that was killed land here: nothing but reapers may live.
    for child in _children():
        if child not in reapers:
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)


def _fds_of(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(
                int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, usable, 4)
            )
    return fds


if __name__ == "__main__":
    _supervise(int(sys.argv[1]))
    os._exit(0)
