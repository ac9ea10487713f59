"""The process host: runs background processes and records their output (a script, stdlib only).

``python -I -S _prochost.py CTL_FD`` starts a *server* (one per host
process, started lazily like the command supervisor). For each process the
host program starts, it sends ``N`` with one end of a fresh socketpair; the
server forks a *process host* on it, which serves one process at a time
(and, once it ended, the next one its manager sends it: see below)::

    host Python --ctl--> server (child subreaper)
        |                  +-- process host (child subreaper; one per running process)
        +-- one socket each --->   +-- command (own session: pipes, or a pty as
                                         its controlling terminal)
                                         +-- ... every descendant

Why a separate process per running handle: output must be recorded while the
agent's event loop does other things (or is not running at all), and a
subreaper per handle knows exactly which orphans belong to which process,
so ``kill`` takes the whole tree (setsid'd, double-forked daemons included)
and nothing else. Forking from a small server costs about a millisecond;
a fresh interpreter would cost twenty.

Messages on a process host's socket (SOCK_SEQPACKET, one message each):

* host program -> process host: ``R`` + JSON request, with the
  working-directory, stdin and wrapper fds (SCM_RIGHTS), then ``D`` + ``WAIT``
  with the record directory, its lock and a first ``W``'s fd (below: the
  wake-up of the read that usually follows a start, of stdout from cursor
  0, so that read sends nothing). The command is spawned between the two: the
  host program writes the record while the command starts (its output waits
  in the pipe), and only then says the start succeeded, so a handle it
  returns always has its record. A host whose ``D`` never comes (the program
  died, or could not write the record) kills the command's tree and exits;
  ``W`` + ``WAIT`` (stream 0/1, or 2 for "the end", a cursor, and how many
  bytes the reader takes pushed) with one fd: the host closes that fd once
  the stream has bytes beyond the cursor (or, for an ended stream, once the
  final state is on disk) -- a one-shot wake-up each reader waits on by
  itself, so any number of readers on any event loop or thread wait without
  polling. Before closing it, the host writes ``PUSHED`` (the stream's end)
  and up to that many bytes from the cursor when the current segment holds
  them, in one write: the reader that was waiting for the first byte gets
  it without touching the files (they are the same bytes, already on disk);
  ``G`` + ``SIG``: signal the process group; ``K`` + reason: kill the tree.
* another program (a resolve of the same workspace elsewhere) -> process
  host: ``W``, ``G`` and ``K`` as above, on a connection to ``<record>/ctl``,
  a socket the host listens on while the command runs, from the end of its
  start (its first output, or 5 ms): binding it earlier would delay that
  first output, and until then another program polls (the record directory
  is private to the host program's user; the peer's uid is checked too).
  Its stdin and terminal stay with the program that started it: two writers
  could interleave input, and one could not close what the other holds.
* process host -> host program: ``S`` + ``STARTED`` (pid, exec errno), with
  the pty master when there is one (the host program writes terminal input
  and resizes through it directly); ``X`` + ``FREE`` (when, on
  CLOCK_MONOTONIC) once the final state is on disk, the tree is dead and the
  record's lock and fds are let go.

After ``X`` the host waits (the request's ``idle`` seconds) for the next
``R`` on the same socket, and serves it as it served the first: a host is
reused, one process at a time, by the program that started it. What
arrives before that ``R`` belonged to the ended process: a reader's wake-up
fd is closed, a signal or kill dropped. Since it kills every descendant
(it is their subreaper: no child left means no descendant left) before
``X``, no process of one handle outlives it into the next.

A command with a terminal starts a session of its own; the pty becomes its
controlling terminal here, unless the request says the launch does that
itself (a sandbox whose pid namespace must own the session: see
local-sandbox's terminal wrapper).

Output goes to ``<record>/stdout/`` and ``<record>/stderr/`` as segment
files named by the cursor of their first byte (``%020d``). A stream keeps
at most ``retained`` bytes on disk: before a new segment is started, the
oldest ones are deleted, whole, until the new one fits. The new segment is
created *before* old ones go, so a reader never sees an empty directory for
a stream that has produced bytes. Pipes are moved into segment files with
``splice(2)`` (no copy through this process) after ``F_SETPIPE_SZ``.

The final state (``final.json``) is written atomically (temp file, fsync,
rename, fsync of the directory) after the tree is dead and the output
drained. While a process host lives it holds an ``flock`` on ``<record>/lock``
(taken by the host program before the start and handed over), so another
process can tell "running elsewhere" from "its host died" (``lost``).

When the host program's socket closes without a ``K`` (the program died),
the process host kills the tree and records the process as ``lost``: the
agent that owned it is gone, and nothing it started may outlive it.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import json
import math
import os
import resource
import select
import signal
import socket
import struct
import sys
import termios
import time

_PR_SET_CHILD_SUBREAPER = 36
_MAX_MESSAGE = 1 << 20
_MAX_FDS = 64
_CHUNK = 1 << 20
_BURST = 16 << 20
_PIPE_SIZE = 1 << 20
_DRAIN_GRACE_S = 2.0
_MAX_WAITERS = 64
_MAX_OTHERS = 16
CONTROL = "ctl"
_MAX_POLL_MS = 3_600_000
_START_QUIET_S = 0.005
_SPARE_LATE_MS = 50
WAIT = struct.Struct("<BQI")
PUSHED = struct.Struct("<Q")
STARTED = struct.Struct("<ii")
SIG = struct.Struct("<i")
FREE = struct.Struct("<d")
WINSIZE = struct.Struct("HHHH")
SEGMENT_FORMAT = "{:020d}"
STREAMS = ("stdout", "stderr")
END = 2
FINAL = "final.json"
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


def _set_subreaper() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _children() -> list[int]:
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children", "rb") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _wakeup_pipe() -> tuple[int, int]:
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    return r, w


def _drain(fd: int) -> None:
    with contextlib.suppress(OSError):
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


def _recv(sock: socket.socket) -> tuple[bytes, list[int]]:
    data, anc, _flags, _addr = sock.recvmsg(
        _MAX_MESSAGE, socket.CMSG_SPACE(_MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
    )
    return data, _fds_of(anc)


class _Log:
    """One output stream as segment files under a directory fd, at most ``retained`` bytes."""

    def __init__(self, dir_fd: int, retained: int, segment: int) -> None:
        self.dir_fd = dir_fd
        self.retained = retained
        self.segment = segment
        self.end = 0
        self.disk = 0
        self.old: collections.deque[tuple[int, int]] = collections.deque()
        self.fd = -1
        self.seg_start = 0
        self.seg_size = 0
        self.splice = hasattr(os, "splice")

    def _room(self) -> int:
        if self.fd < 0 or self.seg_size >= self.segment:
            self._next_segment()
        return self.segment - self.seg_size

    def _next_segment(self) -> None:
        name = SEGMENT_FORMAT.format(self.end)
        fd = os.open(
            # Readable too: the host pushes fresh bytes to waiting readers from it.
            name,
            os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
            0o600,
            dir_fd=self.dir_fd,
        )
        if self.fd >= 0:
            os.close(self.fd)
            self.old.append((self.seg_start, self.seg_size))
        self.fd, self.seg_start, self.seg_size = fd, self.end, 0
        # The new segment may fill up: old ones go, whole, until it fits the window.
        while self.old and self.disk + self.segment > self.retained:
            start, size = self.old.popleft()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(SEGMENT_FORMAT.format(start), dir_fd=self.dir_fd)
            self.disk -= size

    def _moved(self, n: int) -> None:
        self.seg_size += n
        self.end += n
        self.disk += n

    def add(self, data: bytes) -> None:
        """Append bytes (a pty's output, a message of ours)."""
        view = memoryview(data)
        while view:
            room = self._room()
            n = os.write(self.fd, view[:room])
            self._moved(n)
            view = view[n:]

    def pump(self, src: int) -> int:
        """Move what a non-blocking pipe holds into the log; bytes moved, 0 at EOF, -1 if empty."""
        moved = 0
        while moved < _BURST:
            room = self._room()
            try:
                if self.splice:
                    n = os.splice(src, self.fd, min(room, _CHUNK))
                else:
                    n = self._copy(src, room)
            except BlockingIOError:
                return moved or -1
            except OSError as exc:
                if exc.errno == errno.EINVAL and self.splice:
                    self.splice = False
                    continue
                if exc.errno == errno.EIO:  # a pty whose slave side is gone
                    return moved
                raise
            if n == 0:
                return moved
            self._moved(n)
            moved += n
        return moved

    def _copy(self, src: int, room: int) -> int:
        data = os.read(src, min(room, _CHUNK))
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        return len(data)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.dir_fd >= 0:
            os.close(self.dir_fd)  # a reused host must not pile up directories
            self.dir_fd = -1


class _Request:
    """A parsed ``R`` message."""

    def __init__(self, data: bytes, fds: list[int]) -> None:
        spec = json.loads(data[1:])
        self.argv: list[str] = spec["argv"]
        self.env: dict[str, str] = spec["env"]
        self.cwd: str | None = spec["cwd"]
        self.terminal: list[int] | None = spec["terminal"]
        self.timeout: float | None = spec["timeout"]
        self.retained: int = spec["retained"]
        self.segment: int = spec["segment"]
        self.rlimits: list[list[int]] = spec["rlimits"]
        self.signal_as_status: bool = spec["signal_as_status"]
        self.ctty: bool = spec["ctty"]
        # Seconds to wait for the next request once this one is over (0: exit).
        self.idle: float = float(spec.get("idle", 0.0))
        self.cwd_fd = fds[0]
        self.record_fd = self.lock_fd = -1  # from the ``D`` message
        rest = fds[1:]
        self.stdin_fd = rest.pop(0) if spec["has_stdin"] else -1
        self.passes = list(zip(rest, spec["pass_targets"], strict=True))


_SAMPLE: bytes = (
    b"R"
    + json.dumps(
        {
            "argv": ["/nonexistent/corral-warm-up"],  # exec fails: nothing runs
            "env": {"PATH": os.defpath},
            "cwd": "/",
            "terminal": None,
            "timeout": None,
            "retained": 1 << 20,
            "segment": 1 << 18,
            "rlimits": [],  # a spare takes no limits: its request's come later
            "signal_as_status": False,
            "ctty": True,
            "has_stdin": False,
            "pass_targets": [],
        }
    ).encode()
)


def _warm() -> None:
    """Walk a spare through what serving a request touches first, before one comes.

    A forked spare shares its pages with the server until it writes them, and
    CPython writes (reference counts) wherever it runs: the copies are made
    here, while the spare waits, instead of on the start's critical path. The
    spawn path is walked with a program that does not exist (the clone and
    the failed exec cost a tenth of what the first real spawn would: about a
    millisecond in a fresh fork, measured).
    """
    with contextlib.suppress(Exception):
        req = _Request(_SAMPLE, [-1])
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            with contextlib.suppress(OSError):
                fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
            os.set_blocking(r, False)
            poller = select.poll()
            poller.register(r, select.POLLIN)
            poller.poll(0)
            STARTED.pack(0, 0)
            PUSHED.pack(0)
            WAIT.unpack_from(b"W" + WAIT.pack(0, 0, 0), 1)
            _which("true", os.defpath)
            with contextlib.suppress(OSError):
                _posix_spawn(req, [(w, 1)], None)  # fails; glibc reaps its child
        finally:
            _close([r, w])


def _exec_child(req: _Request, moves: list[tuple[int, int]], slave: int, err_w: int) -> None:
    """In the forked child: session, terminal, fds, limits, cwd, then exec (never returns)."""
    code = errno.EINVAL
    try:
        os.setsid()
        if slave >= 0 and req.ctty:
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        targets = {t for _, t in moves}
        base = max([*targets, 2]) + 1
        # Sources out of the way first, so no dup2 clobbers a later source.
        lifted = [(fcntl.fcntl(src, fcntl.F_DUPFD_CLOEXEC, base), t) for src, t in moves]
        for src, target in lifted:
            os.dup2(src, target)
        for res, soft, hard in req.rlimits:
            resource.setrlimit(res, (soft, hard))
        for sig in _RESET_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if req.cwd is not None:
            os.chdir(req.cwd)
        else:
            os.fchdir(req.cwd_fd)
        os.execvpe(req.argv[0], req.argv, req.env)  # noqa: S606 - the guard approved it
    except OSError as exc:
        code = exc.errno or errno.EINVAL
    except BaseException:  # noqa: S110 - reported below as EINVAL
        pass
    with contextlib.suppress(BaseException):
        os.write(err_w, SIG.pack(code))
    os._exit(127)


def _spawnable(req: _Request) -> bool:
    """Whether ``posix_spawn`` can start the command (vfork: ~3x faster than fork here).

    It cannot set limits in the child, so this host takes them on itself
    (it is dedicated to this one command) and the child inherits them; CPU
    time is set on the child right after the spawn (it counts from process
    creation, so nothing escapes). Limits this host could not live with
    (tiny files or fd counts) take the fork path instead.
    """
    for res, soft, _hard in req.rlimits:
        if res == resource.RLIMIT_FSIZE and 0 <= soft < req.segment + (1 << 16):
            return False
        if res == resource.RLIMIT_NOFILE and 0 <= soft < 64:
            return False
    return hasattr(os, "posix_spawn")


def _posix_spawn(req: _Request, moves: list[tuple[int, int]], tty: str | None) -> int:
    cpu = None
    for res, soft, hard in req.rlimits:
        if res == resource.RLIMIT_CPU:
            cpu = (soft, hard)
        else:
            resource.setrlimit(res, (soft, hard))
    if tty is not None and req.ctty:
        # After setsid, opening the terminal without O_NOCTTY makes it the
        # controlling one (glibc runs setsid before the file actions).
        moves = [(src, t) for src, t in moves if t > 2]
        actions: list[tuple[int, ...] | tuple[int, int, str, int, int]] = [
            (os.POSIX_SPAWN_OPEN, 0, tty, os.O_RDWR, 0),
            (os.POSIX_SPAWN_DUP2, 0, 1),
            (os.POSIX_SPAWN_DUP2, 0, 2),
        ]
    else:
        actions = []
    targets = {t for _, t in moves} | ({0, 1, 2} if actions else set())
    base = max([*targets, 2]) + 1
    lifted = [(fcntl.fcntl(src, fcntl.F_DUPFD_CLOEXEC, base), t) for src, t in moves]
    try:
        actions += [(os.POSIX_SPAWN_DUP2, src, t) for src, t in lifted]
        if req.cwd is not None:
            os.chdir(req.cwd)
        else:
            os.fchdir(req.cwd_fd)
        env = {
            k.encode("utf-8", "surrogateescape"): v.encode("utf-8", "surrogateescape")
            for k, v in req.env.items()
        }
        path = _which(req.argv[0], req.env.get("PATH"))
        pid = os.posix_spawn(
            path,
            req.argv,
            env,
            file_actions=actions,
            setsid=True,
            setsigdef=_RESET_SIGNALS,
            setsigmask=(),
        )
    finally:
        _close([fd for fd, _ in lifted])
        os.chdir("/")
    if cpu is not None:
        with contextlib.suppress(OSError):
            resource.prlimit(pid, resource.RLIMIT_CPU, cpu)
    return pid


def _which(name: str, path: str | None) -> str:
    if "/" in name:
        return name
    denied = None
    for entry in (path or "").split(":"):
        if entry.startswith("/"):
            candidate = os.path.join(entry, name)
            if os.path.isfile(candidate):
                if os.access(candidate, os.X_OK):
                    return candidate
                denied = candidate
    if denied is not None:
        return denied  # the spawn reports EACCES (126), as a shell would
    raise FileNotFoundError(errno.ENOENT, "command not found")


class _Host:
    """Serves processes on one socket, one at a time, each from start to final state.

    Built (signal wake-up pipe, subreaper) before its socket arrives, while
    the host is a spare: that work is off the start's critical path. Once a
    process's tree is dead and its final state on disk, the host says ``X``
    and waits (``idle`` seconds from the request) for the next ``R`` on the
    same socket: a reused host has every page it touches already its own,
    where a fresh fork pays for them during the spawn.
    """

    def __init__(self) -> None:
        _set_subreaper()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # replaced in run()
        # To the server, which forks the next spare once this host lets go of it.
        self.link: socket.socket | None = None
        self.wake, _w = _wakeup_pipe()
        self._reset()

    def _reset(self) -> None:
        """Forget the previous process: nothing of it may reach the next one."""
        _drain(self.wake)
        self.listener: socket.socket | None = None
        self.unlistened: tuple[_Request, select.poll] | None = None
        self.others: dict[int, socket.socket] = {}  # connections of other programs
        self.main = 0
        self.status: int | None = None
        self.reason: str | None = None
        self.state = "exited"
        # (fd, cursor, bytes to push) per stream, and for the end
        self.waiters: list[list[tuple[int, int, int]]] = [[], [], []]
        self.logs: list[_Log] = []
        self.outs: dict[int, int] = {}
        self.ended = [False, False]
        self.record_fd = -1

    def run(self, sock: socket.socket) -> None:
        """Serve requests on ``sock`` until it closes, a start fails or the host idles out."""
        self.sock.close()
        self.sock = sock
        data, fds = _recv(self.sock)
        while data[:1] == b"R":
            idle = self._serve_one(_Request(data, fds))
            if idle <= 0:
                return
            data, fds = self._idle(idle)
        _close(fds)

    def _idle(self, idle_s: float) -> tuple[bytes, list[int]]:
        """Wait for the next request; (b"", []) when the socket closed or ``idle_s`` passed.

        What comes before it was meant for the process that ended: a reader's
        wake-up fd is closed (it finds the final state on disk), a signal or a
        kill is dropped -- never kept for the next process.
        """
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        deadline = time.monotonic() + idle_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(math.ceil(remaining * 1000)):
                return b"", []  # the host program stops using idle hosts well before this
            try:
                data, fds = _recv(self.sock)
            except BlockingIOError:
                continue
            except OSError:
                return b"", []
            if not data or data[:1] == b"R":
                return data, fds
            _close(fds)

    def _serve_one(self, req: _Request) -> float:
        """Run one request to its final state; how long to wait for the next (0: exit)."""
        self._reset()
        master, started_errno = self._spawn(req)
        _close(
            [
                req.cwd_fd,
                *([req.stdin_fd] if req.stdin_fd >= 0 else []),
                *(s for s, _ in req.passes),
            ]
        )
        data, fds = _recv(self.sock)
        if data[:1] != b"D" or len(fds) != 3 or len(data) != 1 + WAIT.size:
            # No record to write to: nothing this start began may keep running.
            _close(fds)
            if self.main:
                self._kill_tree()
            return 0.0
        req.record_fd, req.lock_fd, first = fds
        dirs = [
            os.open(s, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=req.record_fd)
            for s in STREAMS
        ]
        self.logs = [_Log(d, req.retained, req.segment) for d in dirs]
        self.record_fd = req.record_fd
        stream, cursor, push = WAIT.unpack_from(data, 1)
        self._add_waiter(stream, cursor, push, first)  # the first reader's, sent with D
        rights = (
            []
            if master < 0
            else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, master.to_bytes(4, sys.byteorder))]
        )
        with contextlib.suppress(OSError):
            self.sock.sendmsg([b"S" + STARTED.pack(self.main, started_errno)], rights)
        if started_errno:
            program = req.argv[0] if req.argv else ""
            why = (
                "command not found"
                if started_errno == errno.ENOENT
                else f"cannot execute: {os.strerror(started_errno)}"
            )
            log = self.logs[0] if master >= 0 else self.logs[1]
            log.add(f"{program}: {why}\n".encode(errors="replace"))
            _close(list(self.outs))
            self.outs.clear()
            self._reap_all()
            self.status = (127 if started_errno == errno.ENOENT else 126) << 8
        else:
            self._serve(req)
        return self._finish(req)

    def _spawn(self, req: _Request) -> tuple[int, int]:
        """Fork the command; return (pty master or -1, exec errno or 0)."""
        slave = master = -1
        theirs: list[int] = []
        moves: list[tuple[int, int]]
        if req.terminal is not None:
            master, slave = os.openpty()
            cols, rows = req.terminal
            fcntl.ioctl(slave, termios.TIOCSWINSZ, WINSIZE.pack(rows, cols, 0, 0))
            moves = [(slave, 0), (slave, 1), (slave, 2)]
            theirs = [slave]
            os.set_blocking(master, False)
            self.outs[master] = 0
            self.ended[1] = True  # one stream: the terminal
        else:
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            for fd in (out_r, err_r):
                with contextlib.suppress(OSError):
                    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
                os.set_blocking(fd, False)
            self.outs[out_r], self.outs[err_r] = 0, 1
            moves = [(req.stdin_fd, 0), (out_w, 1), (err_w, 2)]
            theirs = [out_w, err_w]
        moves += [(src, target) for src, target in req.passes]
        if _spawnable(req):
            try:
                self.main = _posix_spawn(req, moves, os.ttyname(slave) if slave >= 0 else None)
            except OSError as exc:
                return master, exc.errno or errno.EINVAL
            finally:
                _close(theirs)
            return master, 0
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            _exec_child(req, moves, slave, err_w)
        self.main = pid
        _close([*theirs, err_w])
        report = b""
        while True:
            try:
                chunk = os.read(err_r, 4)
            except InterruptedError:
                continue
            if not chunk:
                break
            report += chunk
        os.close(err_r)
        code = SIG.unpack(report[:4])[0] if len(report) >= 4 else 0
        return master, code

    def _serve(self, req: _Request) -> None:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self.wake, select.POLLIN)
        for fd in self.outs:
            poller.register(fd, select.POLLIN)
        # Other programs' control socket waits until the start is over (their
        # readers poll meanwhile): binding it is work on the first byte's path.
        self.unlistened = (req, poller)
        deadline = None if req.timeout is None else time.monotonic() + req.timeout
        quiet = time.monotonic() + _START_QUIET_S
        while True:
            wait_ms = _MAX_POLL_MS
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.state, self.reason = "killed", "timeout"
                    break
                wait_ms = min(math.ceil(remaining * 1000), _MAX_POLL_MS)
            starting = self.link is not None or self.unlistened is not None
            if starting:
                wait_ms = min(wait_ms, max(0, math.ceil((quiet - time.monotonic()) * 1000)))
            ready = poller.poll(wait_ms)
            if starting and time.monotonic() >= quiet:
                self._past_start()  # a quiet command (output lets go in _pump)
            stop = False
            for fd, _ev in ready:
                if fd in self.outs:
                    self._pump(fd, poller)
                elif fd == self.wake:
                    if self._main_exited():
                        stop = True
                elif self.listener is not None and fd == self.listener.fileno():
                    self._accept(poller)
                elif fd in self.others:
                    stop = self._control(self.others[fd], poller) or stop
                elif self._control(self.sock, poller):
                    stop = True
            if stop:
                break
        self._stop_listening(req, poller)
        self.status = self._kill_tree()
        with contextlib.suppress(ValueError, KeyError):
            poller.unregister(self.sock.fileno())
        grace = time.monotonic() + _DRAIN_GRACE_S
        while self.outs:
            remaining = grace - time.monotonic()
            if remaining <= 0:
                break
            for fd, _ev in poller.poll(math.ceil(remaining * 1000)):
                if fd in self.outs:
                    self._pump(fd, poller)
                elif fd == self.wake:
                    _drain(self.wake)

    def _past_start(self) -> None:
        """The start is over: listen for other programs; the server may fork the next spare."""
        if self.unlistened is not None:
            self._listen(*self.unlistened)
            self.unlistened = None
        if self.link is not None:
            with contextlib.suppress(OSError):
                self.link.send(b"F")
            self.link.close()
            self.link = None

    def _pump(self, fd: int, poller: select.poll) -> None:
        index = self.outs[fd]
        moved = self.logs[index].pump(fd)
        if moved == 0:
            poller.unregister(fd)
            os.close(fd)
            del self.outs[fd]
            self.ended[index] = True
        if moved != -1:
            self._notify(index)
            self._past_start()  # its first output is with the readers: the start is over

    def _notify(self, index: int) -> None:
        waiters, self.waiters[index] = self.waiters[index], []
        for fd, cursor, push in waiters:
            self._wake(fd, index, cursor, push)

    def _wake(self, fd: int, index: int, cursor: int, push: int) -> None:
        """Close a waiter's fd, after pushing it the bytes at its cursor when they are at hand."""
        log = self.logs[index] if index < END and self.logs else None
        if push > 0 and log is not None and log.fd >= 0 and log.seg_start <= cursor < log.end:
            with contextlib.suppress(OSError):
                os.set_blocking(fd, False)  # a reader that stopped reading never blocks us
                data = os.pread(log.fd, min(push, log.end - cursor), cursor - log.seg_start)
                # One write (a push is at most 64 KiB): the reader wakes once, not
                # once for the header and again for the bytes.
                os.write(fd, PUSHED.pack(log.end) + data)
        with contextlib.suppress(OSError):
            os.close(fd)

    def _listen(self, req: _Request, poller: select.poll) -> None:
        """Listen on ``<record>/ctl`` for other programs (best effort: without it they poll)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # Through the held directory fd: no path to re-resolve, none too long to bind.
            listener.bind(f"/proc/self/fd/{req.record_fd}/{CONTROL}")
            listener.listen(_MAX_OTHERS)
        except OSError:
            listener.close()
            return
        listener.setblocking(False)
        self.listener = listener
        poller.register(listener.fileno(), select.POLLIN)

    def _stop_listening(self, req: _Request, poller: select.poll) -> None:
        if self.listener is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(CONTROL, dir_fd=req.record_fd)
        poller.unregister(self.listener.fileno())
        self.listener.close()
        self.listener = None
        for fd, conn in list(self.others.items()):
            poller.unregister(fd)
            conn.close()
        self.others.clear()

    def _accept(self, poller: select.poll) -> None:
        assert self.listener is not None
        try:
            conn, _addr = self.listener.accept()
        except OSError:
            return
        _pid, uid, _gid = struct.unpack(
            "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        )
        if uid != os.getuid() or len(self.others) >= _MAX_OTHERS:
            conn.close()
            return
        conn.setblocking(False)
        self.others[conn.fileno()] = conn
        poller.register(conn.fileno(), select.POLLIN)

    def _control(self, sock: socket.socket, poller: select.poll) -> bool:
        """Handle one message from the host program or another one; True to stop (kill)."""
        try:
            data, fds = _recv(sock)
        except BlockingIOError:
            return False
        except OSError:
            data, fds = b"", []
        if not data and sock is not self.sock:
            poller.unregister(sock.fileno())  # another program is done with us
            del self.others[sock.fileno()]
            sock.close()
            return False
        if not data:
            # The host program is gone without closing its workspace.
            self.state, self.reason = "lost", "the program that started it exited"
            return True
        tag = data[:1]
        if tag == b"W" and len(fds) == 1:
            stream, cursor, push = WAIT.unpack_from(data, 1)
            self._add_waiter(stream, cursor, push, fds[0])
            return False
        _close(fds)
        if tag == b"G":
            (sig,) = SIG.unpack_from(data, 1)
            with contextlib.suppress(OSError):
                os.killpg(self.main, sig)
            return False
        if tag == b"K":
            self.state = "killed"
            self.reason = data[1:].decode("utf-8", "replace") or "killed"
            return True
        return False

    def _add_waiter(self, stream: int, cursor: int, push: int, fd: int) -> None:
        if stream > END:
            os.close(fd)
            return
        if stream < END and self.logs[stream].end > cursor:
            self._wake(fd, stream, cursor, push)
            return
        if stream < END and self.ended[stream]:
            # Nothing can follow until the final state says where the stream
            # ended: wake the reader then, not now (it would only ask again).
            stream = END
        waiters = self.waiters[stream]
        waiters.append((fd, cursor, push))
        if len(waiters) > _MAX_WAITERS:
            # A reader that gave up leaves its fd here; the oldest wakes early and asks again.
            os.close(waiters.pop(0)[0])

    def _main_exited(self) -> bool:
        _drain(self.wake)
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return True
            if info is None or info.si_pid == 0:
                return False
            if info.si_pid == self.main:
                return True
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, os.WNOHANG)

    def _kill_tree(self) -> int:
        """Kill the process group and every descendant; the main process's wait status."""
        status: int | None = None
        with contextlib.suppress(OSError):
            os.killpg(self.main, signal.SIGKILL)
        delay = 0.0005
        while True:
            try:
                while True:
                    pid, st = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    if pid == self.main:
                        status = st
            except ChildProcessError:
                break
            for child in _children():
                with contextlib.suppress(OSError):
                    os.kill(child, signal.SIGKILL)
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        return status if status is not None else signal.SIGKILL

    def _reap_all(self) -> None:
        with contextlib.suppress(ChildProcessError):
            while True:
                os.waitpid(-1, 0)

    def _finish(self, req: _Request) -> float:
        self._past_start()
        for log in self.logs:
            log.close()
        for fd in list(self.outs):
            os.close(fd)
        exit_code: int | None = None
        sig: int | None = None
        if self.state != "lost":
            decoded = os.waitstatus_to_exitcode(self.status if self.status is not None else 0)
            exit_code, sig = (decoded, None) if decoded >= 0 else (None, -decoded)
            if req.signal_as_status and exit_code is not None and 128 < exit_code < 160:
                sig, exit_code = exit_code - 128, None
            if self.state == "killed":
                exit_code = None
        final = {
            "state": self.state,
            "exit_code": exit_code,
            "signal": sig,
            "ended_at": None if self.state == "lost" else time.time(),
            "reason": self.reason,
            "stdout_end": self.logs[0].end,
            "stderr_end": self.logs[1].end,
        }
        _write_final(self.record_fd, json.dumps(final).encode())
        # The record is final: its lock and directory go now, before this host
        # can serve another process. ``X`` goes before the readers wake, so the
        # one that finds the end also finds this host free for the next start.
        _close([req.record_fd, req.lock_fd])
        self.record_fd = -1
        sent = False
        with contextlib.suppress(OSError):
            # When this host's idle time began (CLOCK_MONOTONIC is one clock for all programs).
            self.sock.send(b"X" + FREE.pack(time.monotonic()))
            sent = True
        for index in range(3):
            self._notify(index)
        return req.idle if sent and self.state != "lost" else 0.0


def _write_final(dir_fd: int, body: bytes) -> None:
    tmp = f".{FINAL}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, FINAL, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    with contextlib.suppress(OSError):
        os.fsync(dir_fd)


def _serve(ctl_fd: int) -> None:
    ctl = socket.socket(fileno=ctl_fd)
    _set_subreaper()
    wake, wake_w = _wakeup_pipe()
    hosts: set[int] = set()
    poller = select.poll()
    poller.register(ctl.fileno(), select.POLLIN)
    poller.register(wake, select.POLLIN)
    inherited = [ctl.fileno(), wake, wake_w]
    # A host forked ahead of time takes the next request: the fork is off the
    # start's critical path (it costs about a millisecond here). The one after
    # it is forked once a host that took a request says it is past its start
    # (``F`` on its link, or its link closing), so the fork does not compete
    # for the CPU with that start -- or after _SPARE_LATE_MS anyway.
    spare: socket.socket | None = _fork_spare(inherited, hosts)
    links: dict[int, socket.socket] = {}
    while True:
        for fd, ev in poller.poll(-1 if spare is not None else _SPARE_LATE_MS) or [(-1, 0)]:
            if fd == wake:
                _drain(wake)
                _reap(hosts)
                continue
            if fd in links or fd < 0:
                if fd in links:
                    poller.unregister(fd)
                    links.pop(fd).close()
                if spare is None:
                    spare = _fork_spare([*inherited, *links], hosts)
                continue
            if not ev & select.POLLIN:
                return
            data, fds = _recv(ctl)
            if not data:
                return
            if data[:1] == b"N" and len(fds) == 1:
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds[0].to_bytes(4, sys.byteorder))]
                if not _hand_over(spare, rights):
                    # No spare (or it died): fork one for this request directly.
                    pid = os.fork()
                    if pid == 0:
                        dead = [] if spare is None else [spare.fileno()]
                        _become_host([*inherited, *links, *dead], fds[0])
                    hosts.add(pid)
                    if spare is not None:
                        spare.close()
                elif spare is not None:
                    links[spare.fileno()] = spare
                    poller.register(spare.fileno(), select.POLLIN)
                spare = None
                # Not inherited by the next spare: the host program must see EOF
                # on its end once the host it talks to is gone.
                _close(fds)
                continue
            _close(fds)


def _hand_over(spare: socket.socket | None, rights: list[tuple[int, int, bytes]]) -> bool:
    """Pass a host program's socket to the spare; False when there is no live spare."""
    if spare is None:
        return False
    try:
        spare.sendmsg([b"N"], rights)
    except OSError:
        return False
    return True


def _fork_spare(inherited: list[int], hosts: set[int]) -> socket.socket:
    """Fork a host that waits for the socket of the next process to serve."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            ours.close()
            signal.set_wakeup_fd(-1)
            _close(inherited)
            _warm()  # before _Host(): its wake-up pipe hears no SIGCHLD of the warm-up
            host = _Host()
            data, fds = _recv(theirs)
            if data[:1] != b"N" or len(fds) != 1:
                os._exit(0)  # the server went away before a request came
            host.link = theirs
            host.run(socket.socket(fileno=fds[0]))
        except BaseException:
            code = 70
        os._exit(code)
    theirs.close()
    hosts.add(pid)
    return ours


def _become_host(inherited: list[int], sock_fd: int) -> None:
    code = 0
    try:
        signal.set_wakeup_fd(-1)
        _close(inherited)
        _Host().run(socket.socket(fileno=sock_fd))
    except BaseException:
        code = 70
    finally:
        os._exit(code)


def _reap(hosts: set[int]) -> None:
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            hosts.discard(pid)
    # Orphans of a process host that was killed land here: nothing but hosts may live.
    for child in _children():
        if child not in hosts:
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
    os._exit(0)
