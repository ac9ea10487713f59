"""DockerProcessManager: the ``process`` module of docker workspaces.

Each process is an attached exec in the workspace's container (checked by
the shell's :class:`~corral_posix.CommandChecker` first), so it runs inside
the same boundary as the shell's commands. Its output is recorded on the
host, in the workspace's state directory, in exactly the record format of
posix-core's process manager (``meta.json``, ``lock``, segment files under
``stdout/`` and ``stderr/``, an atomic ``final.json``; see ``_procrecord``);
the segment writer, the cursor reader and the record reader are
posix-core's, so the cursor arithmetic exists once::

    <state>/processes/<id>/meta.json | lock | stdout/<cursor> | stderr/<cursor> | final.json

Output is pumped by a small event loop of the manager's own (a thread,
started at the first ``start``), so it is recorded while the caller's loop
does other things. The ``lock`` is flocked while the pump lives: after the
program hosting the provider dies, a resolve reads each record, and one
without a final state whose lock nobody holds is ``lost``.

The whole tree of a handle: every exec carries a random marker in its
environment; kill (explicit, ``timeout_s``, or the workspace closing) kills
every process of the container carrying it, as the shell does on timeout, so
children that ``setsid`` or double-fork die too. A child that scrubs its
environment escapes the marker but not the container's removal at close.
A signal goes to the process group of the exec's main process (docker
makes every exec a session leader).
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import math
import os
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import anyio
import anyio.from_thread
import anyio.to_thread
import attrs

from corral.provider import (
    CommandRequest,
    OperationError,
    ProcessInfo,
    ProcessRequest,
    StreamChunk,
    StreamName,
    TerminalSize,
    WorkspaceEvictedError,
    workspace_closed,
)
from corral_posix import (
    CheckedCommand,
    CommandChecker,
    check_stream_read,
    read_recorded_stream,
    remove_tree,
)

# posix-core's request checks, record reader and cursor reader (one implementation).
from corral_posix._processes import (
    _check_request,
    _read_info,
    _status,
    _update_terminal,
)

from ._engine import DockerEngine, EngineError
from ._execs import engine_errors, kill_marked, require_attaching
from ._options import WORKDIR
from ._procrecord import (
    END,
    LiveProcess,
    abandon_record,
    close_record,
    drain,
    has_terminal,
    make_record,
    open_logs,
)

__all__ = ["DockerProcessManager"]

_ID_LEN: Final = 17
_KILL_WAIT_S: Final = 15.0
_DRAIN_S: Final = 5.0
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_EOF_CHAR: Final = b"\x04"

# cd into the working directory, then become the command (the exec's pid,
# a session leader, stays the process group every signal goes to).
_ENTRY: Final = (
    'cd -- "$1" 2>/dev/null || { echo "corral: the working directory does not exist" >&2; '
    'exit 125; }; shift; exec "$@"'
)
# With a terminal: its size is set in-band before the command runs (the
# Engine API of 1.41 has no size at exec start, and a resize afterwards
# races the program's first look at it).
_TTY_ENTRY: Final = (
    'cd -- "$1" 2>/dev/null || { echo "corral: the working directory does not exist" >&2; '
    'exit 125; }; r=$2; c=$3; shift 3; stty rows "$r" cols "$c" 2>/dev/null; exec "$@"'
)
# Signals the process group of the marked session leader (the exec's main pid).
_SIGNAL: Final = (
    "m=CORRAL_EXEC=$1; sig=$2; for p in /proc/[0-9]*; do n=${p#/proc/}; "
    '[ "$n" = "$$" ] && continue; s=$(cat "$p/stat" 2>/dev/null) || continue; '
    's=${s##*) }; set -- $s; [ "$3" = "$n" ] || continue; '
    "if tr '\\000' '\\n' < $p/environ 2>/dev/null | grep -qxF \"$m\"; then "
    'kill -"$sig" -- -"$n" 2>/dev/null; fi; done; true'
)


class DockerProcessManager:
    """Background processes of one docker workspace (a :class:`corral.provider.ProcessManager`).

    Args:
        engine: The workspace's engine; it must attach exec streams.
        container: Returns the id of the live container.
        checker: The command policy checks (the shell's).
        user: ``UID:GID`` the processes run as.
        state_dir: The workspace's private state directory on the host.
        root: The workspace's host directory (local engines): a missing
            ``cwd`` is then refused at start, as on the POSIX providers;
            without it the process exits 125 saying so.
        gate: Awaited before each start (a restore holds starts back).
    """

    def __init__(
        self,
        engine: DockerEngine,
        container: Callable[[], Awaitable[str]],
        checker: CommandChecker,
        *,
        user: str,
        state_dir: str,
        root: str | None = None,
        gate: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._engine = engine
        self._attaching = require_attaching(engine, "the process module")
        self._container = container
        self._checker = checker
        self._user = user
        self.records = os.path.join(state_dir, "processes")
        self._gate = gate
        self._root = root
        self._live: dict[str, LiveProcess] = {}
        self._closed = False
        self._lock = threading.Lock()
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._portal_cm: Any = None

    # -- start -------------------------------------------------------------------

    async def start(self, request: ProcessRequest) -> ProcessInfo:
        """Start a process in the container; see :meth:`corral.provider.ProcessManager.start`.

        Raises:
            OperationError: The guard's codes (``policy_denied``,
                ``invalid_argument``...), ``closed``, ``failed`` when the
                engine errs.
            WorkspaceEvictedError: The container is gone.
        """
        self._check_open()
        _check_request(request)
        checked = await anyio.to_thread.run_sync(self._check, request)
        workdir = WORKDIR + "".join("/" + p for p in checked.cwd_parts)
        marker = secrets.token_hex(12)
        env = {**checked.env, "CORRAL_EXEC": marker}
        if request.terminal is not None:
            env["TERM"] = "xterm-256color"
        if self._gate is not None:
            await self._gate()
        container_id = await self._container()
        portal = await self._ensure_portal()
        pid = "p" + secrets.token_hex(8)
        record, record_fd, lock_fd = await anyio.to_thread.run_sync(
            make_record, self.records, pid, request
        )
        try:
            size = request.terminal
            entry = (
                [_ENTRY, "corral", workdir]
                if size is None
                else [_TTY_ENTRY, "corral", workdir, str(size.rows), str(size.cols)]
            )
            with engine_errors("docker exec failed"):
                attached = await self._attaching.attach_exec(
                    container_id,
                    ["sh", "-c", *entry, *checked.argv],
                    env=env,
                    workdir="/",
                    user=self._user,
                    stdin=True,
                    terminal=request.terminal,
                )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(abandon_record, record, record_fd, lock_fd)
            raise
        live = LiveProcess(pid, record, attached, marker, request)
        live.record_fd, live.lock_fd = record_fd, lock_fd
        await anyio.to_thread.run_sync(open_logs, live, request.retained_bytes)
        with self._lock:
            closed = self._closed
            if not closed:
                self._live[pid] = live
        if closed:
            live.reason = "the workspace closed"
        portal.start_task_soon(self._pump, live, container_id)
        if closed:
            await self._kill_marked(container_id, [marker])
            raise workspace_closed()
        return ProcessInfo(
            process_id=pid,
            command=request.command,
            state="running",
            started_at=time.time(),
            terminal=request.terminal,
            stdin_open=True,
        )

    def _check(self, request: ProcessRequest) -> CheckedCommand:
        """The shell's checks; with a host root, the cwd must exist beneath it (blocking)."""
        command = CommandRequest(
            request.command,
            cwd=request.cwd,
            env=request.env,
            timeout_s=request.timeout_s or 30.0,
            allowed_commands=request.allowed_commands,
            allow_shell_syntax=request.allow_shell_syntax,
        )
        if self._root is None:
            return self._checker.check_request(command)
        try:
            root_fd = os.open(self._root, _DIR_FLAGS)
        except OSError:
            raise WorkspaceEvictedError(
                "docker: the workspace directory no longer exists", provider_id="docker"
            ) from None
        try:
            checked = self._checker.check_request(command, root_fd=root_fd)
        finally:
            os.close(root_fd)
        if checked.cwd_fd is not None:
            os.close(checked.cwd_fd)
        return checked

    async def _ensure_portal(self) -> anyio.from_thread.BlockingPortal:
        def begin() -> anyio.from_thread.BlockingPortal:
            with self._lock:
                if self._portal is None:
                    cm = anyio.from_thread.start_blocking_portal()  # no name=: anyio 4.7 lacks it
                    self._portal, self._portal_cm = cm.__enter__(), cm
                return self._portal

        portal = self._portal
        return portal if portal is not None else await anyio.to_thread.run_sync(begin)

    # -- the pump (runs on the manager's own event loop) -------------------------

    async def _pump(self, live: LiveProcess, container_id: str) -> None:
        try:
            with anyio.move_on_after(live.timeout_s if live.timeout_s is not None else math.inf):
                await drain(live)
                return
            live.reason = live.reason or "timeout"
            await self._kill_marked(container_id, [live.marker])
            with anyio.move_on_after(_DRAIN_S):
                await drain(live)
        except Exception as exc:  # the record must end, whatever broke the pump
            live.reason = live.reason or f"the output stream failed ({type(exc).__name__})"
        finally:
            with anyio.CancelScope(shield=True):
                await self._finish(live, container_id)

    async def _finish(self, live: LiveProcess, container_id: str) -> None:
        code: int | None = None
        if live.reason is None:
            with contextlib.suppress(EngineError):
                code = await live.attached.exit_code()
        # Whatever the main process left behind dies with its handle.
        await self._kill_marked(container_id, [live.marker])
        await live.attached.aclose()
        if live.reason is not None:
            final: dict[str, Any] = {"state": "killed", "exit_code": None, "signal": None}
        elif code is None:
            final = {"state": "lost", "exit_code": None, "signal": None}
            live.reason = "the engine reported no exit status"
        elif 128 < code < 160:
            final = {"state": "exited", "exit_code": None, "signal": code - 128}
        else:
            final = {"state": "exited", "exit_code": code, "signal": None}
        final |= {
            "ended_at": time.time(),
            "reason": live.reason,
            "stdout_end": live.logs[0].end,
            "stderr_end": live.logs[1].end,
        }
        await anyio.to_thread.run_sync(close_record, live, final)
        with live.lock:
            live.ended = True
            live.stdin_open = False
        live.notify(None)
        live.finished.set()

    async def _kill_marked(self, container_id: str, markers: Sequence[str]) -> None:
        await kill_marked(self._engine, container_id, markers, user=self._user, wait_s=_KILL_WAIT_S)

    # -- output ------------------------------------------------------------------

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

        async def terminal() -> bool:
            return await anyio.to_thread.run_sync(has_terminal, record)

        chunk, _ended = await read_recorded_stream(
            record,
            stream,
            cursor=cursor,
            max_bytes=max_bytes,
            wait_s=wait_s,
            terminal=terminal,
            wait_for=functools.partial(self._wait_for, process_id),
        )
        return chunk

    async def _wait_for(self, process_id: str, index: int, cursor: int, wait_s: float) -> None:
        live = self._live.get(process_id)
        if live is None:
            await anyio.sleep(min(wait_s, 0.05))  # recorded by another program
            return
        sock = live.add_waiter(index, cursor)
        if sock is None:
            return
        try:
            with anyio.move_on_after(wait_s):
                await anyio.wait_readable(sock)
        finally:
            sock.close()

    # -- input -------------------------------------------------------------------

    async def write_stdin(self, process_id: str, data: bytes) -> None:
        """Send bytes to the process's stdin or terminal.

        Raises:
            OperationError: ``closed`` once stdin was closed or the process
                ended; ``busy`` while another write is in progress;
                ``invalid_argument`` for data that is not bytes.
        """
        self._check_open()
        if not isinstance(data, bytes | bytearray | memoryview):
            raise OperationError("data must be bytes", code="invalid_argument")
        live = self._owned(process_id)
        if not live.writing.acquire(blocking=False):
            raise OperationError("another write to this process is in progress", code="busy")
        try:
            if not live.stdin_open or live.ended:
                raise OperationError("the process's stdin is closed", code="closed")
            if not await live.attached.send(bytes(data)):
                live.stdin_open = False
                raise OperationError("the process's stdin is closed", code="closed")
        finally:
            live.writing.release()

    async def close_stdin(self, process_id: str) -> None:
        """Close stdin (EOF); on a terminal, send the EOF character once. Idempotent."""
        self._check_open()
        live = self._live.get(process_id)
        if live is None:
            self._record(process_id)
            return
        while not live.writing.acquire(blocking=False):  # noqa: ASYNC110 -- a threading lock
            await anyio.sleep(0.001)  # a write in progress finishes first
        try:
            if not live.stdin_open or live.ended:
                return
            live.stdin_open = False
            if live.terminal:
                await live.attached.send(_EOF_CHAR)
            else:
                await live.attached.close_stdin()
        finally:
            live.writing.release()

    async def resize(self, process_id: str, size: TerminalSize) -> None:
        """Resize the terminal through the engine's exec resize endpoint.

        Raises:
            OperationError: ``invalid_argument`` without a terminal.
        """
        self._check_open()
        if not isinstance(size, TerminalSize):
            raise OperationError("size must be a TerminalSize", code="invalid_argument")
        live = self._owned(process_id)
        if not live.terminal:
            raise OperationError("the process has no terminal", code="invalid_argument")
        if live.ended:
            return
        try:
            await live.attached.resize(size)
        except EngineError:
            if live.finished.is_set():
                return
            raise OperationError(
                "docker: the terminal could not be resized", code="failed"
            ) from None
        await anyio.to_thread.run_sync(_update_terminal, live.record, size)

    # -- lifetime ----------------------------------------------------------------

    async def wait(self, process_id: str, *, timeout_s: float) -> ProcessInfo:
        """Wait up to ``timeout_s`` for the process to end; its info either way."""
        self._check_open()
        _check_wait(timeout_s, "timeout_s")
        record = self._record(process_id)
        deadline = time.monotonic() + timeout_s
        while True:
            final = await anyio.to_thread.run_sync(_status, record)
            remaining = deadline - time.monotonic()
            if final is not None or remaining <= 0:
                return await self.info(process_id)
            await self._wait_for(process_id, END, 0, remaining)

    async def signal(self, process_id: str, signal: int) -> None:
        """Send a signal to the process group of the process (no-op once it ended)."""
        self._check_open()
        if isinstance(signal, bool) or not isinstance(signal, int) or not 1 <= signal < 65:
            raise OperationError("signal must be a signal number", code="invalid_argument")
        live = self._live.get(process_id)
        if live is None:
            info = await self.info(process_id)
            if info.state == "running":
                raise OperationError("the process belongs to another program", code="busy")
            return
        if live.ended:
            return
        container_id = await self._container()
        with contextlib.suppress(EngineError):
            await self._engine.exec(
                container_id,
                ["sh", "-c", _SIGNAL, "corral-signal", live.marker, str(signal)],
                env={},
                workdir="/",
                user=self._user,
                max_output_bytes=4096,
            )

    async def kill(self, process_id: str) -> ProcessInfo:
        """Kill the process and its whole tree; its final info (idempotent)."""
        self._check_open()
        info = await self.info(process_id)
        if info.state != "running":
            return info
        live = self._live.get(process_id)
        if live is None:
            raise OperationError("the process belongs to another program", code="busy")
        live.reason = live.reason or "killed"
        await self._kill_marked(await self._container(), [live.marker])
        return await self.wait(process_id, timeout_s=_KILL_WAIT_S)

    async def remove(self, process_id: str) -> None:
        """Forget an ended process and its recorded output.

        Raises:
            OperationError: ``invalid_argument`` while it runs.
        """
        self._check_open()
        info = await self.info(process_id)
        if info.state == "running":
            raise OperationError("the process is still running", code="invalid_argument")
        record = self._record(process_id)
        self._live.pop(process_id, None)
        await anyio.to_thread.run_sync(remove_tree, record)

    async def info(self, process_id: str) -> ProcessInfo:
        """What is known of one process now."""
        self._check_open()
        record = self._record(process_id)
        info = await anyio.to_thread.run_sync(_read_info, record)
        if info is None:
            raise OperationError("no such process", code="not_found")
        return self._with_stdin(info)

    async def list(self) -> Sequence[ProcessInfo]:
        """Every process of the workspace, oldest first."""
        self._check_open()
        infos = await anyio.to_thread.run_sync(self._list_records)
        return [self._with_stdin(info) for info in infos]

    def _list_records(self) -> builtins.list[ProcessInfo]:
        try:
            names = os.listdir(self.records)
        except FileNotFoundError:
            return []
        infos = [
            info
            for name in names
            if _valid_id(name) and (info := _read_info(os.path.join(self.records, name)))
        ]
        infos.sort(key=lambda i: (i.started_at, i.process_id))
        return infos

    def _with_stdin(self, info: ProcessInfo) -> ProcessInfo:
        live = self._live.get(info.process_id)
        if info.state == "running" and live is not None and live.stdin_open:
            return attrs.evolve(info, stdin_open=True)
        return info

    def _check_open(self) -> None:
        if self._closed:
            raise workspace_closed()

    def _record(self, process_id: str) -> str:
        if not _valid_id(process_id):
            raise OperationError("no such process", code="not_found")
        record = os.path.join(self.records, process_id)
        if not os.path.isdir(record):
            raise OperationError("no such process", code="not_found")
        return record

    def _owned(self, process_id: str) -> LiveProcess:
        live = self._live.get(process_id)
        if live is None:
            self._record(process_id)
            raise OperationError(
                "the process is not running under this workspace handle", code="closed"
            )
        return live

    async def aclose(self) -> None:
        """Kill every process (whole trees), record them as killed, and refuse later calls."""
        with self._lock:
            self._closed = True
            lives = [live for live in self._live.values() if not live.ended]
        with anyio.CancelScope(shield=True):
            if lives:
                for live in lives:
                    live.reason = live.reason or "the workspace closed"
                with contextlib.suppress(WorkspaceEvictedError):
                    await self._kill_marked(
                        await self._container(), [live.marker for live in lives]
                    )
                deadline = time.monotonic() + _KILL_WAIT_S
                for live in lives:
                    left = max(0.0, deadline - time.monotonic())
                    await anyio.to_thread.run_sync(live.finished.wait, left)
            portal, cm = self._portal, self._portal_cm
            self._portal = self._portal_cm = None
            if portal is not None:
                # Cancels pumps still running (their records end as killed).
                await anyio.to_thread.run_sync(_stop_portal, portal, cm)


def _valid_id(name: object) -> bool:
    return (
        isinstance(name, str)
        and len(name) == _ID_LEN
        and name[0] == "p"
        and all(c in "0123456789abcdef" for c in name[1:])
    )


def _check_wait(value: object, name: str) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (value >= 0 and math.isfinite(value))
    ):
        raise OperationError(f"{name} must be a non-negative number", code="invalid_argument")


def _stop_portal(portal: anyio.from_thread.BlockingPortal, cm: Any) -> None:
    with contextlib.suppress(Exception):
        portal.call(portal.stop, True)
    with contextlib.suppress(Exception):
        cm.__exit__(None, None, None)
