"""The process supervisor and its pool of reapers (run as a script, stdlib only).

``python -I -S _reaper.py CTL_FD`` starts without the embedding application's
site-packages and never touches the application's process state.

Process tree::

    host Python --ctl socket--> supervisor (child subreaper, one per host process)
        |                         +-- reaper (child subreaper, long-lived; pooled)
        +--- one socket each ------>    +-- command (own session and process group)
                                             +-- ... every descendant

The host asks the supervisor for a reaper by sending ``N`` + its idle time
+ the rlimits of its pool, with one end of a fresh socketpair; the supervisor forks a reaper
on it.  From then on the host talks to that reaper directly, one command at
a time, so every orphan the reaper inherits belongs to the current command.
A reaper lowers its *own* rlimits once (children inherit them through
``posix_spawn``; hard limits cannot be raised again, hence one pool per
limits value) and keeps them for life.

Per command (``R`` + request, with the stdin, working-directory and wrapper
fds as SCM_RIGHTS) the reaper creates the output pipes, ``posix_spawn``\\ s
the command in its own session and forwards what the command writes, capped
at the request's limit (``1``/``2`` + bytes; the rest is read and dropped).
When the main process exits, the timeout passes or the host writes ``K``
+ the command's number
(or closes the socket: cancellation, host death) it SIGKILLs the process
group and then every child it has, reaping until it has none -- setsid'd
double-forked daemons were re-parented to it -- drains the pipes and sends
``X`` + the final status.  Only then is it idle and reusable.  It only ever
signals its own unreaped children, so a recycled pid is never hit.

A reaper idle for a while (30 s) exits without a race: it shuts down its
receiving side (the host's next send fails with EPIPE) and answers a request
that was already queued with ``Q`` ("not started"), so the host retries it
elsewhere.  A reaper that would run out of its own CPU limit retires after
the command (a flag in ``X``).

The supervisor is a subreaper too: if a reaper is killed, the orphans land
on it and it kills every child that is not a reaper.  None of this is a
security boundary against a same-user hostile command (it can kill the
supervisor first); it makes "after a command returns, nothing it started
keeps running" hold for ordinary and careless commands.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import resource
import select
import signal
import socket
import struct
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36
_MAX_MESSAGE = 1 << 21
_MAX_FDS = 250
_CHUNK = 1 << 16
_DRAIN_GRACE_S = 2.0
_MAX_POLL_MS = 3_600_000
# Shared with _supervisor.py (which cannot import this script's module state).
REQUEST = struct.Struct("<dqiiiIII")
PASS = struct.Struct("<ii")
RLIMIT = struct.Struct("<iqq")
FINAL = struct.Struct("<bqQQB")
IDLE = struct.Struct("<d")
SEQ = struct.Struct("<Q")
KIND_STATUS, KIND_ERRNO = 0, 1
FLAG_TIMED_OUT, FLAG_RETIRE, FLAG_HAS_CWD = 1, 2, 1
_RESET_SIGNALS = (
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGXCPU,
    signal.SIGCHLD,
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
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


def _wakeup_pipe() -> tuple[int, int]:
    """A pipe that becomes readable on SIGCHLD (the write end is set as wakeup fd)."""
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    return r, w


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass


def _fds_of(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(
                int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, usable, 4)
            )
    return fds


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _which(name: bytes, path: bytes | None) -> bytes:
    if b"/" in name:
        return name
    for entry in (path or b"").split(b":"):
        if entry.startswith(b"/"):
            candidate = os.path.join(entry, name)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    raise FileNotFoundError(errno.ENOENT, "command not found")


class _Command:
    """One parsed ``R`` request."""

    def __init__(self, data: bytes, fds: list[int]) -> None:
        timeout, limit, stdin_idx, cwd_idx, flags, n_pass, n_argv, n_env = REQUEST.unpack_from(
            data, 1
        )
        offset = 1 + REQUEST.size
        self.timeout, self.limit = timeout, limit
        self.stdin = fds[stdin_idx] if stdin_idx >= 0 else None
        self.cwd_fd = fds[cwd_idx] if cwd_idx >= 0 else None
        self.passes = [
            (fds[i], target)
            for i, target in (PASS.unpack_from(data, offset + k * PASS.size) for k in range(n_pass))
        ]
        fields = data[offset + n_pass * PASS.size :].split(b"\0")
        self.cwd = fields.pop(0) if flags & FLAG_HAS_CWD else None
        self.argv = fields[:n_argv]
        env = fields[n_argv : n_argv + 2 * n_env]
        self.env = dict(zip(env[::2], env[1::2], strict=True))


def _spawn(cmd: _Command, devnull: int) -> tuple[int, int, int]:
    """Start the command in its own session; return (pid, stdout read end, stderr read end)."""
    path = _which(cmd.argv[0], cmd.env.get(b"PATH"))
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    extra = [out_w, err_w]
    try:
        if cmd.cwd is not None:
            os.chdir(cmd.cwd)
        elif cmd.cwd_fd is not None:
            os.fchdir(cmd.cwd_fd)
        moves = [(devnull if cmd.stdin is None else cmd.stdin, 0), (out_w, 1), (err_w, 2)]
        moves += cmd.passes
        targets = {target for _, target in moves}
        if any(src in targets for src, _ in moves):
            # Move every source above every target so no dup2 clobbers a later
            # source and none is a same-number no-op that would keep CLOEXEC.
            # Stay low: glibc refuses a file action on an fd above RLIMIT_NOFILE.
            base = max(targets) + 1
            moved = []
            for src, target in moves:
                copy = os.dup2(src, base, inheritable=False) if src == base else _dup(src, base)
                extra.append(copy)
                moved.append((copy, target))
            moves = moved
        pid = os.posix_spawn(
            path,
            cmd.argv,
            cmd.env,
            file_actions=[(os.POSIX_SPAWN_DUP2, src, target) for src, target in moves],
            setsid=True,
            setsigdef=_RESET_SIGNALS,
            setsigmask=(),
        )
    except BaseException:
        _close([out_r, err_r])
        raise
    finally:
        _close(extra)
        # Never pin the workspace directory between commands.
        os.chdir("/")
    os.set_blocking(out_r, False)
    os.set_blocking(err_r, False)
    return pid, out_r, err_r


def _dup(fd: int, base: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, base)


def _kill_tree(main: int, subreaper: bool) -> int:
    """Kill the command and every descendant; return the main process's wait status."""
    status: int | None = None
    # The main process is not reaped yet, so its process-group id cannot be recycled.
    with contextlib.suppress(OSError):
        os.killpg(main, signal.SIGKILL)
    delay = 0.0005
    while True:
        try:
            while True:
                pid, st = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                if pid == main:
                    status = st
        except ChildProcessError:
            break
        if subreaper:
            for child in _children():
                with contextlib.suppress(OSError):
                    os.kill(child, signal.SIGKILL)
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
    return status if status is not None else signal.SIGKILL


class _Stream:
    """One output pipe: what may still be kept and what was dropped."""

    __slots__ = ("discarded", "fd", "room", "tag")

    def __init__(self, fd: int, tag: bytes, limit: int) -> None:
        self.fd, self.tag, self.room, self.discarded = fd, tag, limit, 0


class _Reaper:
    """The long-lived per-command reaper: serves ``R`` requests on one socket."""

    def __init__(self, sock: socket.socket, config: bytes) -> None:
        self.sock = sock
        self.seq = 0
        (self.idle_s,) = IDLE.unpack_from(config)
        limits = config[IDLE.size :]
        self.setup_errno = 0
        self.cpu_budget: float | None = None
        try:
            for i in range(0, len(limits), RLIMIT.size):
                res, soft, hard = RLIMIT.unpack_from(limits, i)
                resource.setrlimit(res, (soft, hard))
                if res == resource.RLIMIT_CPU:
                    # Our own CPU time counts against the limit the commands
                    # inherit: retire long before the soft limit would hit us.
                    signal.signal(signal.SIGXCPU, signal.SIG_IGN)
                    self.cpu_budget = soft / 2
        except (OSError, ValueError) as exc:
            self.setup_errno = getattr(exc, "errno", None) or errno.EPERM
        self.subreaper = _set_subreaper()
        self.wake, _ = _wakeup_pipe()
        self.devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def serve(self) -> None:
        idle = select.poll()
        idle.register(self.sock.fileno(), select.POLLIN)
        while True:
            if not idle.poll(self.idle_s * 1000):
                self._quit_idle()
                return
            data, anc, _flags, _addr = self.sock.recvmsg(
                _MAX_MESSAGE, socket.CMSG_SPACE(_MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
            )
            fds = _fds_of(anc)
            if not data:
                return
            if data[:1] != b"R":
                _close(fds)  # a late "K" for a command that already ended
                continue
            self.seq += 1
            final, host_gone = self._run(data, fds)
            if host_gone:
                return
            try:
                self.sock.sendall(final)
            except OSError:
                return
            if final[-1] & FLAG_RETIRE:
                return

    def _quit_idle(self) -> None:
        self.sock.shutdown(socket.SHUT_RD)
        self.sock.setblocking(False)
        with contextlib.suppress(OSError):
            while True:
                data, anc, _f, _a = self.sock.recvmsg(
                    _MAX_MESSAGE, socket.CMSG_SPACE(_MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
                )
                _close(_fds_of(anc))
                if not data:
                    return
                if data[:1] == b"R":
                    self.sock.send(b"Q")

    def _final(self, kind: int, value: int, out: int, err: int, flags: int) -> bytes:
        if self.cpu_budget is not None:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            if usage.ru_utime + usage.ru_stime > self.cpu_budget:
                flags |= FLAG_RETIRE
        return b"X" + FINAL.pack(kind, value, out, err, flags)

    def _run(self, data: bytes, fds: list[int]) -> tuple[bytes, bool]:
        """Run one command to the end; return (final message, host went away)."""
        if self.setup_errno:
            # Fail closed: never run a command without the pool's limits.
            _close(fds)
            return self._final(KIND_ERRNO, self.setup_errno, 0, 0, 0), False
        try:
            cmd = _Command(data, fds)
            main, out_r, err_r = _spawn(cmd, self.devnull)
        except (OSError, ValueError, UnicodeError, IndexError, struct.error) as exc:
            code = getattr(exc, "errno", None) or errno.EINVAL
            return self._final(KIND_ERRNO, code, 0, 0, 0), False
        finally:
            _close(fds)
        out, err = _Stream(out_r, b"1", cmd.limit), _Stream(err_r, b"2", cmd.limit)
        streams = {out_r: out, err_r: err}
        poller = select.poll()
        for fd in (self.sock.fileno(), self.wake, out_r, err_r):
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + cmd.timeout
        flags = 0
        host_gone = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                flags |= FLAG_TIMED_OUT
                break
            ready = poller.poll(min(math.ceil(remaining * 1000), _MAX_POLL_MS))
            host_gone = self._forward(ready, poller, streams)
            if host_gone:
                break
            if any(fd == self.sock.fileno() for fd, _ in ready):
                # "K" + this command's number, or EOF because the host gave up
                # or died: kill now.  A "K" meant for an earlier command (a
                # racing aclose on another thread) is ignored.
                try:
                    message = self.sock.recv(16)
                except OSError:
                    message = b""
                host_gone = not message
                if host_gone or message == b"K" + SEQ.pack(self.seq):
                    break
            if any(fd == self.wake for fd, _ in ready) and self._main_exited(main):
                break
        status = _kill_tree(main, self.subreaper)
        # Every writer is dead now; a copy leaked to a stranger must not hang us.
        poller.unregister(self.sock.fileno())
        grace = time.monotonic() + _DRAIN_GRACE_S
        while streams and not host_gone:
            remaining = grace - time.monotonic()
            if remaining <= 0:
                break
            host_gone = self._forward(poller.poll(math.ceil(remaining * 1000)), poller, streams)
        _close(list(streams))
        _drain(self.wake)
        final = self._final(KIND_STATUS, status, out.discarded, err.discarded, flags)
        return final, host_gone

    def _forward(
        self, ready: list[tuple[int, int]], poller: select.poll, streams: dict[int, _Stream]
    ) -> bool:
        """Send the host what fits under each stream's cap; True if the host went away."""
        for fd, _ev in ready:
            stream = streams.get(fd)
            if stream is None:
                continue
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:
                continue
            if not chunk:
                poller.unregister(fd)
                os.close(fd)
                del streams[fd]
                continue
            kept = chunk[: stream.room] if len(chunk) > stream.room else chunk
            stream.room -= len(kept)
            stream.discarded += len(chunk) - len(kept)
            if kept:
                try:
                    self.sock.sendmsg([stream.tag, kept])
                except OSError:
                    return True
        return False

    def _main_exited(self, main: int) -> bool:
        _drain(self.wake)
        while True:
            # Peek without reaping: an unreaped main keeps its process group
            # id from being recycled until the group is killed.
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is None or info.si_pid == 0:
                return False
            if info.si_pid == main:
                return True
            # An orphan that exited: reap it so a long command cannot pile up zombies.
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, os.WNOHANG)


def _supervise(ctl_fd: int) -> None:
    ctl = socket.socket(fileno=ctl_fd)
    _set_subreaper()
    wake, wake_w = _wakeup_pipe()
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
            if data[:1] == b"N" and len(fds) == 1:
                pid = os.fork()
                if pid == 0:
                    _become_reaper([ctl.fileno(), wake, wake_w], fds[0], data[1:])
                reapers.add(pid)
            _close(fds)


def _become_reaper(inherited: list[int], sock_fd: int, config: bytes) -> None:
    code = 0
    try:
        # The supervisor's wakeup fd must not be written to once it is closed.
        signal.set_wakeup_fd(-1)
        _close(inherited)
        _Reaper(socket.socket(fileno=sock_fd), config).serve()
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


if __name__ == "__main__":
    _supervise(int(sys.argv[1]))
    os._exit(0)
