"""HostProcessManager: the ``process`` module of tmpdir workspaces (local-bash, local-sandbox).

Each process is guarded by the shell's :class:`CommandChecker`, re-shaped by
the same :class:`CommandWrapper` (so on local-sandbox it runs in bubblewrap
with the same mounts, seccomp filter, network policy and cgroup), and run
by a process host of its own (``_prochost.py``) that records its output in
the workspace's state directory -- never inside the tree the command can
write -- as it arrives::

    <state>/processes/<id>/meta.json      command, start time, terminal, window
                          /lock           flock held by the live process host
                          /stdout/<cursor> segment files (see _streamlog.py)
                          /stderr/<cursor>
                          /final.json     state, exit code, signal, reason (atomic)

Reading needs nobody's help: a fresh provider in another program reads the
same files; a record with no ``final.json`` whose lock nobody holds was
left by a host that died, and reads as ``lost``.

Waiting is push, not polling: a reader sends its process host a one-shot
fd and waits for it to become readable; the host closes it as soon as the
stream passes the reader's cursor. Terminal input and resizes go straight
to the pty master, which the host hands over at start.

Another program (a resolve of the same workspace) signals and kills a
running process through the socket its host listens on in the record
(``ctl``): the host is the subreaper of exactly that tree, so no pid is
ever guessed or reused. Its stdin and terminal stay with the program that
started it (two writers would interleave, and one could not close what the
other holds); from elsewhere they are refused with that reason.

Hosts are reused, as the shell reuses its reapers: once this manager learns
that a process ended and its host said ``X`` (tree dead, final state on
disk, record let go), the host's socket leaves the process's handle --
under the handle's send lock, so nothing meant for that process can reach
the next one -- and waits in the manager's :class:`IdleHosts` for the next
start. A warm host takes a start's request several hundred microseconds
sooner than a freshly forked one (measured: the fork's page faults and the
server's hand-over no longer compete with the spawn).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import math
import os
import re
import secrets
import socket
import struct
import sys
import termios
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

import anyio
import anyio.to_thread

from corral.provider import (
    CommandRequest,
    OperationError,
    ProcessInfo,
    ProcessRequest,
    ProcessState,
    StreamChunk,
    StreamName,
    TerminalSize,
    WorkspaceEvictedError,
    workspace_closed,
)

from . import _prochost_launch
from ._checker import CommandChecker
from ._env import StartEnvironment
from ._fdtree import remove_tree_at
from ._prochost_launch import PROCESS_HOSTS, IdleHosts
from ._shell import ProcessLimits
from ._streamlog import StreamExtent, extent, read_stream, segment_size
from ._wrapper import IDENTITY_WRAPPER, CommandWrapper, wrap_guarded

__all__ = ["HostProcessManager", "ProcessChecks", "check_stream_read", "read_recorded_stream"]

_WAIT = struct.Struct("<BQI")
_PUSHED = struct.Struct("<Q")
_PUSH_MAX: Final = 1 << 16
_SIG = struct.Struct("<i")
_STARTED = struct.Struct("<ii")
_FREE = struct.Struct("<d")
_WINSIZE = struct.Struct("HHHH")
_STREAM_INDEX: Final = {"stdout": 0, "stderr": 1}
_END: Final = 2
_ID_RE: Final = re.compile(r"p[0-9a-f]{16}")
_PROCESSES: Final = "processes"
_KILL_WAIT_S: Final = 15.0
_MAX_RETAINED: Final = 1 << 40
_MAX_READ: Final = 64 << 20
_STDIN_PIPE: Final = 1 << 20
_FOREIGN_POLL_S: Final = 0.05
_CONTROL: Final = "ctl"
_INPUT_ELSEWHERE: Final = (
    "the process's stdin and terminal belong to the program that started it; "
    "from another program it can be read, waited for, signalled and killed"
)
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_EOF_CHAR: Final = b"\x04"
_FS_ENCODING: Final = sys.getfilesystemencoding()


class ProcessChecks:
    """What an isolation adds around background processes (local-sandbox's guards).

    Args:
        before_start: Awaited before each start; raises to refuse it (the
            workspace is over its disk quota, a protected path is dirty...).
        monitor: Called (blocking, in a thread) every ``interval_s`` while
            any process of the workspace runs, and once after the last one
            ends; returns a reason to kill every running process, or None.
        interval_s: Seconds between two ``monitor`` calls.
    """

    def __init__(
        self,
        *,
        before_start: Callable[[], Awaitable[None]] | None = None,
        monitor: Callable[[], str | None] | None = None,
        interval_s: float = 2.0,
    ) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be positive")
        self.before_start = before_start
        self.monitor = monitor
        self.interval_s = interval_s


_Infos = list[ProcessInfo]  # the manager's ``list`` method shadows the builtin in its body


class _Live:
    """A process this manager started: its host socket and input fd."""

    def __init__(
        self, pid: str, sock: socket.socket, stdin_fd: int, terminal: bool, idle_s: float
    ) -> None:
        self.id = pid
        # None once its host went on to serve another process (or is gone).
        self.sock: socket.socket | None = sock
        self.idle_s = idle_s
        # Held while sending: the host changes hands only between two sends, so
        # nothing meant for this process (a kill from the monitor thread...)
        # can reach the next process of the same host.
        self.sending = threading.Lock()
        self.stdin_fd = stdin_fd
        self.terminal = terminal
        self.stdin_open = True
        self.writing = threading.Lock()
        self.ended = False
        # Per stream: an end this manager has seen. A read from before it
        # finds bytes on disk; from at or after it, the read asks the host,
        # which pushes the first bytes the moment they exist.
        self.seen = [0, 0]
        # A wake-up for stdout at cursor 0 the start already gave the host
        # (``W`` sent with ``D``): the first such read waits on it.
        self.first: socket.socket | None = None

    def take_first(self, index: int, cursor: int) -> socket.socket | None:
        """The start's wake-up, for a read of stdout from cursor 0 (once); else None."""
        first = self.first
        if first is None or index != 0:
            return None
        self.first = None
        if cursor == 0:
            return first
        first.close()  # that reader has moved on: the host's end is closed at the latest at the end
        return None

    def drop_first(self) -> None:
        first, self.first = self.first, None
        if first is not None:
            first.close()

    def close_stdin_fd(self) -> None:
        if self.stdin_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.stdin_fd)
            self.stdin_fd = -1
        self.stdin_open = False

    def send(self, message: bytes, fds: Sequence[int] = ()) -> bool:
        """Send one message to the process host; False if it is gone (or serves another)."""
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]
        with self.sending:
            sock = self.sock
            if sock is None:
                return False
            for _ in range(1000):
                try:
                    sock.sendmsg([message], rights if fds else [], socket.MSG_NOSIGNAL)
                except BlockingIOError:
                    time.sleep(0.001)  # tiny messages: the host drains them at once
                except OSError:
                    return False
                else:
                    return True
        return False

    def free_host(self) -> tuple[bool, tuple[float, socket.socket] | None]:
        """Take the host off this ended process once it said it is free (non-blocking).

        Returns:
            Whether this process is done with its host, and then the host's
            socket and when it became free (None when the host is gone).
        """
        if not self.sending.acquire(blocking=False):
            return False, None  # a send in progress (another thread): later
        try:
            sock = self.sock
            if sock is None:
                return True, None
            since = _free_since(sock)
            if since is None:
                return False, None
            self.sock = None
        finally:
            self.sending.release()
        if since < 0:
            sock.close()
            return True, None
        return True, (since, sock)

    def close_sock(self) -> None:
        with self.sending:
            sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()
        self.drop_first()


_Lives = list[_Live]


class HostProcessManager:
    """Background processes of one tmpdir workspace (a :class:`corral.provider.ProcessManager`).

    Args:
        root: Host path of the workspace root.
        state_dir: The workspace's private state directory (outside ``root``).
        checker: The command policy checks (as the shell's).
        wrapper: Re-shapes every guarded command (as the shell's).
        terminal_wrapper: Re-shapes commands that get a terminal, and makes the
            pty their controlling terminal itself (inside the isolation's
            namespaces). None: ``wrapper``, and the process host makes the
            pty the controlling terminal of the command's new session.
        base_env: Operator-trusted variables added to every process.
        limits: rlimits for every process (as the shell's).
        checks: Guards the isolation adds (see :class:`ProcessChecks`).
        provider_id: Named in :class:`corral.WorkspaceEvictedError`.
    """

    def __init__(
        self,
        root: str,
        state_dir: str,
        *,
        checker: CommandChecker | None = None,
        wrapper: CommandWrapper | None = None,
        terminal_wrapper: CommandWrapper | None = None,
        base_env: Mapping[str, str] | None = None,
        limits: ProcessLimits | None = None,
        checks: ProcessChecks | None = None,
        provider_id: str | None = None,
    ) -> None:
        self.root = os.path.abspath(root)
        self.records = os.path.join(state_dir, _PROCESSES)
        self.checker = checker or CommandChecker()
        self.wrapper = wrapper or IDENTITY_WRAPPER
        self.terminal_wrapper = terminal_wrapper or self.wrapper
        # A terminal wrapper of the isolation's own gives the pty its session inside.
        self._ctty = terminal_wrapper is None
        self._env = StartEnvironment(self.root, base_env or {})
        self._rlimits = [list(r) for r in (limits or ProcessLimits()).rlimits()]
        self._checks = checks
        self._provider_id = provider_id
        self._live: dict[str, _Live] = {}
        # Ended processes whose host has not said it is free yet (see _free_host).
        self._ending: dict[str, _Live] = {}
        self._hosts = IdleHosts()
        self._closed = False
        self._monitor: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()

    # -- start -------------------------------------------------------------------

    async def start(self, request: ProcessRequest) -> ProcessInfo:
        """Start a process; see :meth:`corral.provider.ProcessManager.start`.

        Raises:
            OperationError: The guard's codes (``policy_denied``,
                ``invalid_argument``, ``invalid_path``, ``not_found``...);
                ``closed``; ``failed`` when no process host can be started.
            WorkspaceEvictedError: The workspace root no longer exists.
        """
        self._check_open()
        _check_request(request)
        if self._checks is not None and self._checks.before_start is not None:
            await self._checks.before_start()
        pid = "p" + secrets.token_hex(8)
        # One worker-thread hop guards, hands the request to a process host and
        # writes the record while the host spawns the command.
        prepared = await anyio.to_thread.run_sync(self._prepare, pid, request)
        sock = prepared.sock
        assert sock is not None
        prepared.sock = None
        try:
            # Only a terminal needs the host's answer (its pty master). Without
            # one the request is durable once sent: the record is on disk, its
            # lock went to the host with it, and a host that fails now leaves
            # the record "lost" for every reader.
            master = -1 if request.terminal is None else await _started(sock)
        except BaseException:
            sock.close()
            prepared.close()
            raise
        stdin_fd = master if master >= 0 else prepared.stdin_w
        if master >= 0 and prepared.stdin_w >= 0:
            os.close(prepared.stdin_w)
        prepared.stdin_w = -1
        live = _Live(pid, sock, stdin_fd, request.terminal is not None, prepared.idle_s)
        live.first, prepared.first = prepared.first, None
        prepared.close()
        with self._lock:
            if self._closed:
                live.send(b"Kthe workspace closed")
                live.close_sock()
                live.close_stdin_fd()
                raise workspace_closed()
            self._live[pid] = live
        self._ensure_monitor()
        # The first info, by definition "running": a fast process may already
        # have ended, which the next info() reports.
        return ProcessInfo(
            process_id=pid,
            command=request.command,
            state="running",
            started_at=prepared.started_at,
            terminal=request.terminal,
            stdin_open=True,
        )

    def _prepare(self, pid: str, request: ProcessRequest) -> _Prepared:
        """Guard, hand the request to a process host, write the record (blocking).

        The host spawns the command as soon as it has the request (``R``);
        the record is written meanwhile and handed over after (``D``), with
        its lock: its output waits in the pipe until then, and start returns
        only once the record is on disk. When the record cannot be written or
        handed over, the host's socket closes and it kills what it started.
        The next ready host is asked for last, off the command's start.
        """
        try:
            root_fd = os.open(self.root, _DIR_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            raise WorkspaceEvictedError(
                "the workspace directory no longer exists", provider_id=self._provider_id
            ) from None
        try:
            guarded = self.checker.check_request(
                CommandRequest(
                    request.command,
                    cwd=request.cwd,
                    env=request.env,
                    timeout_s=request.timeout_s or 30.0,
                    allowed_commands=request.allowed_commands,
                    allow_shell_syntax=request.allow_shell_syntax,
                ),
                root_fd=root_fd,
            )
        finally:
            os.close(root_fd)
        assert guarded.cwd_fd is not None
        prepared = _Prepared(guarded.cwd_fd)
        try:
            env = {**self._env.get()}
            if request.terminal is not None:
                env["TERM"] = "xterm-256color"
            env.update(guarded.env)
            wrapped = wrap_guarded(
                self.wrapper if request.terminal is None else self.terminal_wrapper,
                guarded.argv,
                root=self.root,
                cwd_fd=guarded.cwd_fd,
                cwd_parts=guarded.cwd_parts,
                env=env,
            )
            _check_text([*wrapped.argv, *wrapped.env, *wrapped.env.values()])
            if request.terminal is None:
                r, w = os.pipe2(os.O_CLOEXEC)
                prepared.stdin_r, prepared.stdin_w = r, w
                with contextlib.suppress(OSError):
                    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, _STDIN_PIPE)
                os.set_blocking(w, False)
            prepared.pass_fds = list(wrapped.pass_fds)
            prepared.idle_s = _prochost_launch.HOST_IDLE_S
            spec = {
                "argv": list(wrapped.argv),
                "env": dict(wrapped.env),
                "cwd": wrapped.cwd,
                "terminal": _size(request.terminal),
                "timeout": request.timeout_s,
                "retained": request.retained_bytes,
                "segment": segment_size(request.retained_bytes),
                "rlimits": self._rlimits,
                "signal_as_status": wrapped.signal_as_status,
                "has_stdin": request.terminal is None,
                "ctty": self._ctty,
                "pass_targets": list(prepared.pass_fds),
                "idle": prepared.idle_s,
            }
            for ending in self._ended_hosts():
                self._free_host(ending)
            prepared.sock, pooled = _send_spawn(
                prepared, b"R" + json.dumps(spec).encode(), self._hosts
            )
            try:
                self._create_record(prepared, pid, request)
                _send_record(prepared)
            except BaseException:
                with contextlib.suppress(OSError):
                    self._remove_record(pid)  # its host kills the command on the socket's EOF
                raise
            if not pooled:
                with contextlib.suppress(OperationError):
                    PROCESS_HOSTS.replenish()  # or the next start asks for its own
        except BaseException:
            prepared.close()
            raise
        return prepared

    def _create_record(self, prepared: _Prepared, pid: str, request: ProcessRequest) -> None:
        """The record directory, ``meta.json`` and the held lock (blocking).

        On a start's path to its first output byte: the records directory is
        made only when missing, and the rest is made through the record's fd.
        """
        record = os.path.join(self.records, pid)
        try:
            os.mkdir(record, 0o700)
        except FileNotFoundError:
            os.makedirs(self.records, mode=0o700, exist_ok=True)
            os.mkdir(record, 0o700)
        prepared.record_fd = record_fd = os.open(record, _DIR_FLAGS)
        for stream in _STREAM_INDEX:
            os.mkdir(stream, 0o700, dir_fd=record_fd)
        started = prepared.started_at = time.time()
        _write_json(
            record_fd,
            "meta.json",
            {
                "id": pid,
                "command": request.command,
                "started_at": started,
                "terminal": _size(request.terminal),
                "retained": request.retained_bytes,
            },
        )
        prepared.lock_fd = os.open(
            "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600, dir_fd=record_fd
        )
        fcntl.flock(prepared.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    # -- reading -----------------------------------------------------------------

    async def read(
        self,
        process_id: str,
        stream: StreamName = "stdout",
        *,
        cursor: int = 0,
        max_bytes: int = 65536,
        wait_s: float = 0.0,
    ) -> StreamChunk:
        """Bytes of a stream from a cursor; see :meth:`corral.provider.ProcessManager.read`.

        Raises:
            CursorExpiredError: ``cursor`` is before the retained window.
            OperationError: ``invalid_argument``; ``not_found``; ``closed``.
        """
        self._check_open()
        check_stream_read(stream, cursor, max_bytes, wait_s)
        record = self._record(process_id)
        index = _STREAM_INDEX[stream]
        live = self._live.get(process_id)
        if (
            live is not None
            and not live.ended
            and wait_s > 0
            and cursor >= live.seen[index]
            and not (live.terminal and stream == "stderr")
        ):
            began = time.monotonic()
            pushed = await _pushed(live, index, cursor, min(max_bytes, _PUSH_MAX), wait_s)
            if pushed:
                return StreamChunk(pushed, cursor, cursor + len(pushed), False)
            wait_s = max(0.0, wait_s - (time.monotonic() - began))
        chunk, ended = await read_recorded_stream(
            record,
            stream,
            cursor=cursor,
            max_bytes=max_bytes,
            wait_s=wait_s,
            terminal=functools.partial(self._has_terminal, process_id, record),
            wait_for=functools.partial(self._wait_for, process_id),
        )
        if ended and not chunk.data:
            self._forget_input(process_id)
        if live is not None:
            live.seen[index] = max(live.seen[index], chunk.next_cursor)
        return chunk

    async def _has_terminal(self, process_id: str, record: str) -> bool:
        live = self._live.get(process_id)
        if live is not None:
            return live.terminal
        meta = await anyio.to_thread.run_sync(_load_json, os.path.join(record, "meta.json"))
        return bool(meta and meta.get("terminal"))

    async def _wait_for(self, process_id: str, index: int, cursor: int, within: float) -> None:
        """Wait until the host says the stream passed ``cursor`` or ended (at most ``within`` s)."""
        live = self._live.get(process_id)
        if live is None or live.ended:
            await anyio.sleep(min(within, _FOREIGN_POLL_S))  # another program's process
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            ours.setblocking(False)
            sent = live.send(b"W" + _WAIT.pack(index, cursor, 0), [theirs.fileno()])
            theirs.close()
            if not sent:
                live.ended = True
                return
            with anyio.move_on_after(within):
                await anyio.wait_readable(ours)
        finally:
            theirs.close()
            ours.close()

    # -- input -------------------------------------------------------------------

    async def write_stdin(self, process_id: str, data: bytes) -> None:
        """Send bytes to the process's stdin or terminal.

        Raises:
            OperationError: ``closed`` once stdin was closed or the process
                ended; ``busy`` while another write to it is in progress, or
                when another program started it (its input stays there);
                ``invalid_argument`` for data that is not bytes.
        """
        self._check_open()
        if not isinstance(data, bytes | bytearray | memoryview):
            raise OperationError("data must be bytes", code="invalid_argument")
        live = await self._owned(process_id)
        if not live.writing.acquire(blocking=False):
            raise OperationError("another write to this process is in progress", code="busy")
        try:
            if not live.stdin_open or live.stdin_fd < 0:
                raise OperationError("the process's stdin is closed", code="closed")
            await _write_all(live.stdin_fd, memoryview(bytes(data)))
        except BrokenPipeError:
            live.close_stdin_fd()
            raise OperationError("the process's stdin is closed", code="closed") from None
        except OSError as exc:
            if exc.errno in (errno.EIO, errno.EBADF):
                raise OperationError("the process's stdin is closed", code="closed") from None
            raise
        finally:
            live.writing.release()

    async def close_stdin(self, process_id: str) -> None:
        """Close stdin (EOF); on a terminal, send the EOF character once. Idempotent.

        Raises:
            OperationError: ``busy`` when another program started it (its input stays there).
        """
        self._check_open()
        live = self._live.get(process_id)
        if live is None:
            info = await self.info(process_id)  # not_found for an unknown id
            if info.state == "running":
                raise OperationError(_INPUT_ELSEWHERE, code="busy")
            return
        # A thread lock (writes may come from several event loops): poll it.
        while not live.writing.acquire(blocking=False):  # noqa: ASYNC110
            await anyio.sleep(0.001)
        try:
            if not live.stdin_open:
                return
            if live.terminal:
                with contextlib.suppress(OSError):
                    os.write(live.stdin_fd, _EOF_CHAR)
                live.stdin_open = False  # the master stays: resize still needs it
            else:
                live.close_stdin_fd()
        finally:
            live.writing.release()

    async def resize(self, process_id: str, size: TerminalSize) -> None:
        """Resize the terminal (the kernel sends SIGWINCH to its foreground group).

        Raises:
            OperationError: ``invalid_argument`` without a terminal.
        """
        self._check_open()
        if not isinstance(size, TerminalSize):
            raise OperationError("size must be a TerminalSize", code="invalid_argument")
        live = await self._owned(process_id)
        if not live.terminal:
            raise OperationError("the process has no terminal", code="invalid_argument")
        if live.stdin_fd < 0 or live.ended:
            return
        with contextlib.suppress(OSError):
            fcntl.ioctl(
                live.stdin_fd, termios.TIOCSWINSZ, _WINSIZE.pack(size.rows, size.cols, 0, 0)
            )
        record = os.path.join(self.records, process_id)
        await anyio.to_thread.run_sync(_update_terminal, record, size)

    # -- lifetime ----------------------------------------------------------------

    async def wait(self, process_id: str, *, timeout_s: float) -> ProcessInfo:
        """Wait up to ``timeout_s`` for the process to end; its info either way."""
        self._check_open()
        if not (isinstance(timeout_s, int | float) and timeout_s >= 0 and math.isfinite(timeout_s)):
            raise OperationError("timeout_s must be a non-negative number", code="invalid_argument")
        record = self._record(process_id)
        deadline = time.monotonic() + timeout_s
        while True:
            final = await anyio.to_thread.run_sync(_status, record)
            remaining = deadline - time.monotonic()
            if final is not None or remaining <= 0:
                return await self.info(process_id)
            await self._wait_for(process_id, _END, 0, remaining)

    async def signal(self, process_id: str, signal: int) -> None:
        """Send a signal to the process group (no-op once it ended).

        A process another program started is signalled through its host.

        Raises:
            OperationError: ``busy`` when its host does not answer.
        """
        self._check_open()
        if isinstance(signal, bool) or not isinstance(signal, int) or not 1 <= signal < 65:
            raise OperationError("signal must be a signal number", code="invalid_argument")
        live = self._live.get(process_id)
        if live is None:
            if (await self.info(process_id)).state == "running":
                await self._tell_host(process_id, b"G" + _SIG.pack(signal))
            return
        live.send(b"G" + _SIG.pack(signal))

    async def kill(self, process_id: str) -> ProcessInfo:
        """Kill the process and its whole tree; its final info (idempotent).

        A process another program started is killed by its host (its subreaper).

        Raises:
            OperationError: ``busy`` when its host does not answer.
        """
        self._check_open()
        info = await self.info(process_id)
        if info.state != "running":
            return info
        live = self._live.get(process_id)
        if live is None:
            await self._tell_host(process_id, b"Kkilled")
        else:
            live.send(b"Kkilled")
        with anyio.move_on_after(_KILL_WAIT_S):
            return await self.wait(process_id, timeout_s=_KILL_WAIT_S)
        return await self.info(process_id)

    async def remove(self, process_id: str) -> None:
        """Forget an ended process and its recorded output.

        Raises:
            OperationError: ``invalid_argument`` while it runs.
        """
        self._check_open()
        info = await self.info(process_id)
        if info.state == "running":
            raise OperationError("the process is still running", code="invalid_argument")
        live = self._live.pop(process_id, None)
        if live is not None:
            live.close_stdin_fd()
            live.drop_first()
            live.ended = True
            self._free_host(live)
        await anyio.to_thread.run_sync(self._remove_record, process_id)

    def _remove_record(self, process_id: str) -> None:
        try:
            fd = os.open(self.records, _DIR_FLAGS)
        except FileNotFoundError:
            return
        try:
            remove_tree_at(fd, process_id)
        finally:
            os.close(fd)

    # -- queries -----------------------------------------------------------------

    async def info(self, process_id: str) -> ProcessInfo:
        """What is known of one process now."""
        self._check_open()
        record = self._record(process_id)
        info = await anyio.to_thread.run_sync(_read_info, record)
        if info is None:
            raise OperationError("no such process", code="not_found")
        live = self._live.get(process_id)
        if info.state != "running":
            self._forget_input(process_id)
        elif live is not None and live.stdin_open:
            return _evolve(info, stdin_open=True)
        return info

    async def list(self) -> Sequence[ProcessInfo]:
        """Every process of the workspace, oldest first."""
        self._check_open()
        infos = await anyio.to_thread.run_sync(self._list_records)
        out = []
        for found in infos:
            live = self._live.get(found.process_id)
            if found.state == "running" and live is not None and live.stdin_open:
                found = _evolve(found, stdin_open=True)  # noqa: PLW2901
            out.append(found)
        return out

    def _list_records(self) -> _Infos:
        try:
            names = os.listdir(self.records)
        except FileNotFoundError:
            return []
        infos = []
        for name in names:
            if _ID_RE.fullmatch(name):
                info = _read_info(os.path.join(self.records, name))
                if info is not None:
                    infos.append(info)
        infos.sort(key=lambda i: (i.started_at, i.process_id))
        return infos

    # -- helpers -----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise workspace_closed()

    def _record(self, process_id: str) -> str:
        if not isinstance(process_id, str) or not _ID_RE.fullmatch(process_id):
            raise OperationError("no such process", code="not_found")
        record = os.path.join(self.records, process_id)
        if not os.path.isdir(record):
            raise OperationError("no such process", code="not_found")
        return record

    async def _owned(self, process_id: str) -> _Live:
        """This manager's live process, else why its input cannot be reached from here."""
        live = self._live.get(process_id)
        if live is None:
            info = await self.info(process_id)  # not_found for an unknown id
            if info.state == "running":
                raise OperationError(_INPUT_ELSEWHERE, code="busy")
            raise OperationError("the process ended; its stdin is closed", code="closed")
        return live

    async def _tell_host(self, process_id: str, message: bytes) -> bool:
        """Send a message to the host of a process another program started; False if it ended.

        Raises:
            OperationError: ``busy`` when it runs but its host cannot be reached.
        """
        record = self._record(process_id)
        for _ in range(100):
            sock = await anyio.to_thread.run_sync(_connect_host, record)
            if sock is not None:
                with sock:
                    try:
                        sock.send(message)
                    except OSError:
                        sock = None
                    else:
                        return True
            if await anyio.to_thread.run_sync(_status, record) is not None:
                return False
            await anyio.sleep(_FOREIGN_POLL_S)  # its host is finishing or still starting
        raise OperationError("the process's host does not answer to other programs", code="busy")

    def _forget_input(self, process_id: str) -> None:
        live = self._live.get(process_id)
        if live is not None and not live.ended:
            live.ended = True
            live.drop_first()  # its host closed the other end at the end
            if live.writing.acquire(blocking=False):
                try:
                    live.close_stdin_fd()
                finally:
                    live.writing.release()
            self._free_host(live)

    def _free_host(self, live: _Live) -> None:
        """Pool the host of an ended process once it said it is free; until then, keep asking.

        Non-blocking (a socket read): called where the manager learns of the
        end, and again for every start until the host has answered.
        """
        settled, freed = live.free_host()
        with self._lock:
            if settled:
                self._ending.pop(live.id, None)
            else:
                self._ending[live.id] = live
        if freed is not None:
            self._hosts.put(freed[0], live.idle_s, freed[1])

    def _ended_hosts(self) -> _Lives:
        with self._lock:
            return list(self._ending.values())

    def _running(self) -> _Lives:
        return [live for live in list(self._live.values()) if not live.ended]

    def _ensure_monitor(self) -> None:
        checks = self._checks
        if checks is None or checks.monitor is None:
            return
        with self._lock:
            if self._monitor is not None and self._monitor.is_alive():
                return
            thread = threading.Thread(
                target=self._watch, args=(checks,), name="corral-process-monitor", daemon=True
            )
            self._monitor = thread
            thread.start()

    def _watch(self, checks: ProcessChecks) -> None:
        """While processes run: run the isolation's monitor; kill them all if it says so."""
        assert checks.monitor is not None
        while not self._stop.wait(checks.interval_s):
            running = [
                live
                for live in self._running()
                if _status(os.path.join(self.records, live.id)) is None
            ]
            try:
                reason = checks.monitor()
            except Exception:
                reason = "the workspace could not be checked"
            if reason is not None:
                for live in running:
                    live.send(b"K" + reason.encode())
            if not running:
                with self._lock:
                    self._monitor = None
                return

    async def aclose(self) -> None:
        """Kill every process this manager started (whole trees) and refuse later calls."""
        with self._lock:
            self._closed = True
            lives = list(self._live.values())
        self._stop.set()
        for live in lives:
            live.send(b"Kthe workspace closed")
        with anyio.move_on_after(_KILL_WAIT_S, shield=True):
            for live in lives:
                record = os.path.join(self.records, live.id)
                while await anyio.to_thread.run_sync(_status, record) is None:
                    sock = live.sock
                    if sock is None:
                        break
                    await _wait_closed(sock, 0.5)
        with self._lock:
            lives += [live for live in self._ending.values() if live not in lives]
            self._ending.clear()
        for live in lives:
            live.close_stdin_fd()
            live.close_sock()  # an idle host exits on its socket's end
        self._live.clear()
        self._hosts.close()
        monitor = self._monitor
        if monitor is not None:
            await anyio.to_thread.run_sync(monitor.join, 5.0)


async def _pushed(live: _Live, index: int, cursor: int, most: int, within: float) -> bytes:
    """Wait (at most ``within`` s) for the host to push the bytes at ``cursor``; b"" if it did not.

    The host answers once the stream passed ``cursor``: the stream's end,
    then up to ``most`` bytes from ``cursor`` when its current segment holds
    them; or it only closes the wake-up (the bytes are in an older segment,
    the stream or the host ended), and the caller reads the files.
    """
    got = bytearray()
    ours = live.take_first(index, cursor)
    theirs = None
    if ours is None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if theirs is not None:
            ours.setblocking(False)
            sent = live.send(b"W" + _WAIT.pack(index, cursor, most), [theirs.fileno()])
            theirs.close()
            if not sent:
                live.ended = True
                return b""
        with anyio.move_on_after(within):
            want = _PUSHED.size + most
            while len(got) < want:
                try:
                    part = ours.recv(want - len(got))
                except BlockingIOError:
                    await anyio.wait_readable(ours)
                    continue
                if not part:
                    break
                got += part
                if len(got) >= _PUSHED.size:
                    # The stream's end says how many bytes follow: waiting for the
                    # host to close the fd as well would cost another wake-up.
                    (end,) = _PUSHED.unpack_from(got)
                    want = _PUSHED.size + max(0, min(most, end - cursor))
    finally:
        if theirs is not None:
            theirs.close()
        ours.close()
    if len(got) <= _PUSHED.size:
        return b""
    (end,) = _PUSHED.unpack_from(got)
    live.seen[index] = max(live.seen[index], end)
    return bytes(got[_PUSHED.size :])


def _send_spawn(prepared: _Prepared, payload: bytes, idle: IdleHosts) -> tuple[socket.socket, bool]:
    """Hand the ``R`` message to a process host (blocking); its socket, and whether it was idle.

    An idle host of this manager goes first, else the host the server keeps
    ready. Either may have died since: a send that finds it gone moves on
    (nothing was delivered).

    Raises:
        OperationError: ``too_large`` for a command or environment over a
            message; ``failed`` when no process host can be reached.
    """
    fds = [prepared.cwd_fd]
    if prepared.stdin_r >= 0:
        fds.append(prepared.stdin_r)
    fds += prepared.pass_fds
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]
    fresh = 0
    while fresh < 2:
        sock = idle.take()
        pooled = sock is not None
        if sock is None:
            sock = PROCESS_HOSTS.take()
            fresh += 1
        try:
            sock.setblocking(True)  # a worker thread: a full socket may hold it
            sock.sendmsg([payload], rights, socket.MSG_NOSIGNAL)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EMSGSIZE:
                raise OperationError(
                    "command and environment are too large to run", code="too_large"
                ) from None
            continue
        except BaseException:
            sock.close()
            raise
        return sock, pooled
    raise OperationError("the process host went away", code="failed")


def _send_record(prepared: _Prepared) -> None:
    """Send the ``D`` message: the record, its lock and a first reader's wake-up.

    Raises:
        OperationError: ``failed`` when the host died since it took the request
            (the command is not retried elsewhere: it may have begun).
    """
    assert prepared.sock is not None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    rights = [
        (
            socket.SOL_SOCKET,
            socket.SCM_RIGHTS,
            struct.pack("3i", prepared.record_fd, prepared.lock_fd, theirs.fileno()),
        )
    ]
    try:
        # The wake-up of a reader of stdout from cursor 0 rides along: the first
        # read after a start (the common one) then sends nothing and waits on it.
        prepared.sock.sendmsg([b"D" + _WAIT.pack(0, 0, _PUSH_MAX)], rights, socket.MSG_NOSIGNAL)
    except OSError:
        ours.close()
        raise OperationError("the process host went away", code="failed") from None
    finally:
        theirs.close()
        prepared.sock.setblocking(False)
    ours.setblocking(False)
    prepared.first = ours


async def _started(sock: socket.socket) -> int:
    """Wait for the host's ``S`` answer; the pty master it hands over (or -1).

    Raises:
        OperationError: ``failed`` when the host died instead.
    """
    while True:
        try:
            data, anc, _flags, _addr = sock.recvmsg(
                64, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC
            )
        except BlockingIOError:
            await anyio.wait_readable(sock)
            continue
        if data[:1] != b"S":
            raise OperationError("the process host failed to start", code="failed")
        received = [
            int.from_bytes(payload[i : i + 4], sys.byteorder)
            for level, kind, payload in anc
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
            for i in range(0, len(payload) - len(payload) % 4, 4)
        ]
        return received[0] if received else -1


class _Prepared:
    """Fds and the request of a start in progress; each fd closed once."""

    def __init__(self, cwd_fd: int) -> None:
        self.cwd_fd = cwd_fd
        self.record_fd = -1
        self.lock_fd = -1
        self.stdin_r = -1
        self.stdin_w = -1
        self.pass_fds: list[int] = []
        self.started_at = 0.0
        self.idle_s = 0.0  # what the host was told to wait for its next process
        self.sock: socket.socket | None = None  # the process host's, once it took the request
        self.first: socket.socket | None = None  # the first stdout reader's wake-up (see _Live)

    def close(self) -> None:
        for name in ("sock", "first"):
            sock = getattr(self, name)
            if sock is not None:
                sock.close()
                setattr(self, name, None)
        for name in ("cwd_fd", "record_fd", "lock_fd", "stdin_r", "stdin_w"):
            fd = getattr(self, name)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, -1)


def _free_since(sock: socket.socket) -> float | None:
    """Read what a host said (non-blocking): when it became free (``X``), -1.0 when it is
    gone, None while it has said neither."""
    while True:
        try:
            data, anc, _flags, _addr = sock.recvmsg(
                64, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC
            )
        except BlockingIOError:
            return None
        except OSError:
            return -1.0
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                for i in range(0, len(payload) - len(payload) % 4, 4):
                    os.close(int.from_bytes(payload[i : i + 4], sys.byteorder))  # an unread S's pty
        if not data:
            return -1.0
        if data[:1] == b"X":
            return _FREE.unpack_from(data, 1)[0] if len(data) >= 1 + _FREE.size else -1.0


async def _wait_closed(sock: socket.socket, within: float) -> None:
    """Wait up to ``within`` seconds until the host's socket has something (``X``, or EOF)."""
    with anyio.move_on_after(within):
        while True:
            try:
                if not sock.recv(64):
                    await anyio.sleep(0.01)
                    return
            except BlockingIOError:
                await anyio.wait_readable(sock)
            except OSError:
                return


async def _write_all(fd: int, view: memoryview) -> None:
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            await anyio.wait_writable(fd)
            continue
        view = view[n:]


def _check_request(request: ProcessRequest) -> None:
    if not isinstance(request, ProcessRequest):
        raise OperationError("request must be a ProcessRequest", code="invalid_argument")
    timeout = request.timeout_s
    if timeout is not None and not (
        isinstance(timeout, int | float) and timeout > 0 and math.isfinite(timeout)
    ):
        raise OperationError("timeout_s must be a positive number", code="invalid_argument")
    retained = request.retained_bytes
    if (
        isinstance(retained, bool)
        or not isinstance(retained, int)
        or not 1 <= retained <= _MAX_RETAINED
    ):
        raise OperationError(
            "retained_bytes must be an integer from 1 to 2**40", code="invalid_argument"
        )


def _check_int(value: object, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OperationError(
            f"{name} must be an integer of at least {minimum}", code="invalid_argument"
        )


def _check_text(fields: Sequence[str]) -> None:
    for field in fields:
        try:
            encoded = field.encode(_FS_ENCODING, "surrogateescape")
        except UnicodeError:
            raise OperationError(
                "command or environment is not valid text", code="invalid_argument"
            ) from None
        if b"\0" in encoded:
            raise OperationError(
                "command or environment contains a NUL byte", code="invalid_argument"
            )


def _size(size: TerminalSize | None) -> list[int] | None:
    return None if size is None else [size.cols, size.rows]


def _write_json(directory: str | int, name: str, value: object) -> None:
    """Replace a small JSON file atomically in a directory (a path or an fd).

    No fsync: it only has to survive a crash of this program, not of the
    machine; the process host fsyncs the final state.
    """
    tmp, final = f".{name}.{secrets.token_hex(4)}", name
    dir_fd = directory if isinstance(directory, int) else None
    if dir_fd is None:
        tmp, final = os.path.join(str(directory), tmp), os.path.join(str(directory), name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        os.write(fd, json.dumps(value).encode())
    finally:
        os.close(fd)
    os.replace(tmp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def check_stream_read(stream: object, cursor: object, max_bytes: object, wait_s: object) -> None:
    """The arguments of :meth:`corral.provider.ProcessManager.read`, checked before any I/O.

    Raises:
        OperationError: ``invalid_argument``, naming the argument, not its value.
    """
    if stream not in _STREAM_INDEX:
        raise OperationError("stream must be 'stdout' or 'stderr'", code="invalid_argument")
    _check_int(cursor, "cursor", 0)
    _check_int(max_bytes, "max_bytes", 1)
    if not (
        isinstance(wait_s, int | float)
        and not isinstance(wait_s, bool)
        and wait_s >= 0
        and math.isfinite(wait_s)
    ):
        raise OperationError("wait_s must be a non-negative number", code="invalid_argument")


async def read_recorded_stream(
    record: str,
    stream: StreamName,
    *,
    cursor: int,
    max_bytes: int,
    wait_s: float,
    terminal: Callable[[], Awaitable[bool]],
    wait_for: Callable[[int, int, float], Awaitable[None]],
) -> tuple[StreamChunk, bool]:
    """Read a recorded stream from a cursor: the one cursor arithmetic of every manager.

    Host processes (this module) and docker's processes record output the same
    way (segment files named by their first cursor, ``final.json`` once every
    byte is on disk); this is how both answer ``read`` -- exact cursors, expiry
    naming the earliest cursor, ``ended`` exactly when no byte can follow, an
    empty ended stderr for a terminal.

    Args:
        record: The process's record directory.
        stream: ``stdout`` or ``stderr`` (arguments already checked by :func:`check_stream_read`).
        cursor: Byte offset to read from.
        max_bytes: At most this many bytes.
        wait_s: How long to wait for a byte at ``cursor``.
        terminal: Whether the process has a terminal (its stderr is then empty and ended).
        wait_for: ``(stream index, cursor, seconds)`` -- returns when the stream
            passed ``cursor``, ended, or the time is up (the manager's wake-up).

    Returns:
        The chunk, and whether the process's end was recorded.

    Raises:
        CursorExpiredError: ``cursor`` is before the retained window.
        OperationError: ``invalid_argument`` for a cursor beyond an ended stream's end.
    """
    if stream == "stderr" and await terminal():
        if cursor > 0:
            raise OperationError(
                f"cursor {cursor} is beyond the end of the ended stream (0)",
                code="invalid_argument",
            )
        return StreamChunk(b"", 0, 0, True), False
    path = os.path.join(record, stream)
    index = _STREAM_INDEX[stream]
    deadline = time.monotonic() + wait_s
    want = min(max_bytes, _MAX_READ)
    while True:
        final, data, seen = await anyio.to_thread.run_sync(
            _status_and_bytes, record, path, cursor, want
        )
        end = seen.end
        if final is not None:
            recorded = final.get(f"{stream}_end")
            end = recorded if isinstance(recorded, int) else seen.end
        if data:
            after = cursor + len(data)
            return StreamChunk(data, cursor, after, final is not None and after >= end), (
                final is not None
            )
        if final is not None:
            if cursor > end:
                raise OperationError(
                    f"cursor {cursor} is beyond the end of the ended stream ({end})",
                    code="invalid_argument",
                )
            return StreamChunk(b"", cursor, cursor, cursor == end), True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return StreamChunk(b"", cursor, cursor, False), False
        await wait_for(index, cursor, remaining)


def _status_and_bytes(
    record: str, path: str, cursor: int, want: int
) -> tuple[dict[str, Any] | None, bytes, StreamExtent]:
    """The state, then the bytes at ``cursor`` (blocking; one worker-thread hop).

    The state is read first: when it is final, every byte is already on disk.
    """
    final = _status(record)
    data, seen = read_stream(path, cursor, want)
    return final, data, seen


def _connect_host(record: str) -> socket.socket | None:
    """A connection to the control socket of a record's live host, or None (blocking)."""
    try:
        dir_fd = os.open(record, _DIR_FLAGS)
    except OSError:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        # Through the held directory fd: no symlink swapped in on the way, no path too long.
        sock.connect(f"/proc/self/fd/{dir_fd}/{_CONTROL}")
    except OSError:
        sock.close()
        return None
    finally:
        os.close(dir_fd)
    return sock


def _load_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            value = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _host_alive(record: str) -> bool:
    """Whether a process host still holds the record's lock (blocking)."""
    try:
        fd = os.open(os.path.join(record, "lock"), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def _status(record: str) -> dict[str, Any] | None:
    """The final state, a synthesised ``lost`` one when its host died, or None while running."""
    final = _load_json(os.path.join(record, "final.json"))
    if final is not None:
        return final
    if _host_alive(record):
        return None
    final = _load_json(os.path.join(record, "final.json"))  # it may have just finished
    if final is not None:
        return final
    return {"state": "lost", "reason": "its process host died"}


def _read_info(record: str) -> ProcessInfo | None:
    meta = _load_json(os.path.join(record, "meta.json"))
    if meta is None:
        return None
    final = _status(record)
    out = extent(os.path.join(record, "stdout"))
    err = extent(os.path.join(record, "stderr"))
    terminal = meta.get("terminal")
    recorded = "running" if final is None else final.get("state", "lost")
    states: dict[object, ProcessState] = {
        "running": "running",
        "exited": "exited",
        "killed": "killed",
    }
    state = states.get(recorded, "lost")
    final = final or {}
    return ProcessInfo(
        process_id=str(meta.get("id", os.path.basename(record))),
        command=str(meta.get("command", "")),
        state=state,
        exit_code=final.get("exit_code"),
        signal=final.get("signal"),
        started_at=float(meta.get("started_at", 0.0)),
        ended_at=final.get("ended_at"),
        terminal=None if not terminal else TerminalSize(cols=terminal[0], rows=terminal[1]),
        stdout_end=out.end,
        stderr_end=err.end,
        stdout_start=out.start,
        stderr_start=err.start,
        stdin_open=False,
        reason=final.get("reason"),
    )


def _update_terminal(record: str, size: TerminalSize) -> None:
    meta = _load_json(os.path.join(record, "meta.json"))
    if meta is not None:
        meta["terminal"] = _size(size)
        _write_json(record, "meta.json", meta)


def _evolve(info: ProcessInfo, **changes: Any) -> ProcessInfo:
    import attrs

    return attrs.evolve(info, **changes)
