"""Attached exec streams: the hijacked connection of the Engine API's exec start.

``POST /exec/{id}/start`` with ``Connection: Upgrade`` turns the HTTP
connection into a raw byte pipe: what the client writes is the process's
stdin (a half-close is its EOF), what it reads is its output -- one raw
stream with a TTY, otherwise frames of ``[stream, 0, 0, 0, size:u32be]``
followed by ``size`` bytes of stdout (1) or stderr (2). This is how stdin of
any size and any bytes reaches a command in the container, and how output
is seen while the command still runs.

The connection is whatever the SDK's adapter opened for the configured
address: a unix socket, a TCP (or TLS) socket, or a paramiko channel running
``docker system dial-stdio`` on an ``ssh://`` host. Bytes the HTTP parser
read past the response head are kept (the daemon may send output in the same
packet as its ``101`` answer). Every blocking call runs on a worker thread; a
read waiting for output is abandoned on cancellation and its thread ends
when the connection is closed.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Literal, Protocol, TypeVar, runtime_checkable

import anyio
import anyio.to_thread

from corral.provider import TerminalSize

from ._engine import EngineError

__all__ = ["AttachedExec", "AttachingEngine", "Chunk", "open_attached", "wait_exit_code"]

T = TypeVar("T")

Chunk = tuple[Literal["stdout", "stderr"], bytes]
"""Bytes of one output stream."""

_READ_BYTES: Final = 256 * 1024
_WRITE_BYTES: Final = 1 << 20
_HEADER: Final = struct.Struct(">BxxxL")
# Reports the exit status after the command's stderr; see ``AttachedExec``.
_TRAILER_SH: Final = (
    'n=$1; shift; "$@"; c=$?; printf "\\000corral-exit-%s:%d" "$n" "$c" >&2; exit "$c"'
)

# Polling the engine's record of an ended exec: 5 ms doubling to 250 ms,
# about 9 s in all, far above the instant the engine lags behind a stream's end.
STATUS_POLLS: Final = 40
_FIRST_POLL_S: Final = 0.005
_LAST_POLL_S: Final = 0.25


class ApiCall(Protocol):
    """Runs a blocking function of the SDK's API client on a worker thread.

    Its errors become :class:`EngineError`; with ``abandon`` a cancelled
    caller stops waiting for the thread.
    """

    def __call__(
        self, what: str, fn: Callable[[Any], T], /, *, abandon: bool = False
    ) -> Awaitable[T]:
        """Run ``fn(api)``; ``what`` heads the error message."""
        ...


class _Handoff:
    """A started pipe passed from a worker thread the caller may have abandoned.

    Whoever comes second closes it: the thread when the caller already left,
    else the caller. So an exec start abandoned on cancellation leaks no
    connection, whenever the cancellation lands.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pipe: _Pipe | None = None
        self._left = False

    def give(self, pipe: _Pipe) -> None:
        with self._lock:
            if not self._left:
                self._pipe = pipe
                return
        pipe.close()

    def take(self) -> _Pipe | None:
        with self._lock:
            self._left = True
            pipe, self._pipe = self._pipe, None
            return pipe


@runtime_checkable
class AttachingEngine(Protocol):
    """An engine that can run an exec with its streams attached (the SDK engine does)."""

    async def attach_exec(
        self,
        container_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        workdir: str,
        user: str,
        stdin: bool,
        terminal: TerminalSize | None = None,
        exit_trailer: bool = False,
    ) -> AttachedExec:
        """Create and start an exec with its streams attached.

        Args:
            container_id: The running container.
            argv: The command (not run through a shell by this call).
            env: Its environment on top of the container's.
            workdir: Its working directory.
            user: ``UID:GID`` it runs as.
            stdin: Attach stdin (else the command reads ``/dev/null``).
            terminal: Run it on a pseudo-terminal of this size.
            exit_trailer: Report the exit status in-band, saving the extra
                connection ``exec inspect`` costs (worth it over ssh).

        Raises:
            EngineError: The engine refused or is unreachable.
        """
        ...


class _Pipe:
    """The blocking byte pipe under a hijacked response, for each transport."""

    def __init__(self, response: Any) -> None:
        self._response = response
        fp = response.raw._fp.fp
        channel = getattr(fp, "channel", None)
        self._closed = False
        if channel is not None:
            # paramiko: the channel's file buffered what the HTTP parser over-read.
            self._channel: Any = channel
            self._sock: socket.socket | None = None
            self._pending = bytes(getattr(fp, "_rbuffer", b""))
            channel.settimeout(None)
        else:
            self._channel = None
            raw = fp.raw
            self._sock = raw._sock
            self._fp = fp
            self._pending = b""
            self._sock.settimeout(None)

    def recv(self) -> bytes:
        """Up to a buffer of bytes; ``b""`` at the end."""
        if self._pending:
            data, self._pending = self._pending, b""
            return data
        if self._channel is not None:
            return bytes(self._channel.recv(_READ_BYTES))
        # The buffered reader returns what it over-read first, then one recv.
        return bytes(self._fp.read1(_READ_BYTES))

    def sendall(self, data: bytes) -> None:
        """Write everything (raises OSError when the other end is gone)."""
        if self._channel is not None:
            self._channel.sendall(data)
        else:
            assert self._sock is not None
            self._sock.sendall(data)

    def shutdown_write(self) -> None:
        """Half-close: the command reads EOF on stdin."""
        if self._channel is not None:
            self._channel.shutdown_write()
        else:
            assert self._sock is not None
            # socket.socket's own shutdown: an SSLSocket's would drop its TLS
            # state and with it the read side.
            socket.socket.shutdown(self._sock, socket.SHUT_WR)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (a failed read after it is the close, not a fault)."""
        return self._closed

    def close(self) -> None:
        """Close both ways; wakes a thread blocked in :meth:`recv`. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._channel is not None:
                self._channel.close()
            else:
                assert self._sock is not None
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
        except OSError:
            pass
        # Closing a dead connection must not mask the error that killed it.
        with contextlib.suppress(Exception):
            self._response.close()


_LOST = (
    "exec: the connection to the engine broke while the command's output was read; "
    "some of its output may be missing"
)


class AttachedExec:
    """A running exec with its streams attached.

    Output is read with :meth:`receive`; stdin written with :meth:`send` and
    ended with :meth:`close_stdin`. A read cancelled while waiting leaves the
    connection unusable for reads (its thread may still consume bytes), so
    only cancel one when giving up on the exec, then :meth:`aclose` it.

    With ``exit_trailer`` the command runs under a ``sh`` that prints
    ``\\0corral-exit-NONCE:CODE`` to stderr when it ends; the trailer is
    held back from stderr and parsed at the end (the random nonce means a
    command can only forge its own exit code with it).
    """

    def __init__(
        self,
        pipe: _Pipe,
        exec_id: str,
        call: ApiCall,
        *,
        tty: bool,
        trailer: bytes = b"",
    ) -> None:
        self._pipe = pipe
        self.exec_id = exec_id
        self._call = call
        self.tty = tty
        self._buf = bytearray()
        self._trailer = trailer
        self._hold = len(trailer) + 12 if trailer else 0
        self._held = b""
        self._trailer_code: int | None = None
        self._eof = False
        self._broken = False
        self._lost = False
        self._stdin_closed = False

    async def receive(self) -> list[Chunk] | None:
        """The next output (one or more chunks), or None at the end of the streams.

        Raises:
            EngineError: The connection broke before the end (output may be
                missing), or an earlier read was cancelled.
        """
        while True:
            if self._lost:
                raise EngineError(_LOST)
            if self._eof:
                return None
            if self._broken:
                raise EngineError("attached exec: a cancelled read left the stream unusable")
            try:
                # A limiter of its own: a read may wait for hours (an idle
                # server) and must not hold a token of the loop's default pool.
                # Made per call, in whichever event loop reads.
                data = await anyio.to_thread.run_sync(
                    self._recv, abandon_on_cancel=True, limiter=anyio.CapacityLimiter(1)
                )
            except anyio.get_cancelled_exc_class():
                self._broken = True
                raise
            if self._lost:
                raise EngineError(_LOST)
            if not data:
                self._eof = True
                return self._finish()
            chunks = self._parse(data)
            if chunks:
                return chunks

    def receive_blocking(self) -> list[Chunk] | None:
        """:meth:`receive` for a thread of the caller's own: blocks, cannot be cancelled.

        For readers that must never lose bytes to a cancelled wait (a code
        context's channel): the thread reads, the event loop waits on what
        it hands over. :meth:`aclose` from elsewhere ends it.

        Raises:
            EngineError: The connection broke before the end.
        """
        while not self._eof:
            data = self._recv()
            if self._lost:
                raise EngineError(_LOST)
            if not data:
                self._eof = True
                return self._finish()
            chunks = self._parse(data)
            if chunks:
                return chunks
        return None

    def _recv(self) -> bytes:
        try:
            return self._pipe.recv()
        except OSError:
            # After aclose() the failure is the close itself: the reader was told
            # to stop. Otherwise the connection broke (the engine reset it, the ssh
            # link dropped): an end of output would be a lie, output may be missing.
            if not self._pipe.closed:
                self._lost = True
            return b""

    def _parse(self, data: bytes) -> list[Chunk]:
        if self.tty:
            return [("stdout", data)]
        buf = self._buf
        buf += data
        out: list[Chunk] = []
        at = 0
        while len(buf) - at >= _HEADER.size:
            kind, size = _HEADER.unpack_from(buf, at)
            if len(buf) - at - _HEADER.size < size:
                break
            payload = bytes(buf[at + _HEADER.size : at + _HEADER.size + size])
            at += _HEADER.size + size
            if not payload or kind not in (1, 2):
                continue
            if kind == 2 and self._hold:
                payload = self._hold_back(payload)
                if not payload:
                    continue
            name: Literal["stdout", "stderr"] = "stdout" if kind == 1 else "stderr"
            if out and out[-1][0] == name:
                out[-1] = (name, out[-1][1] + payload)
            else:
                out.append((name, payload))
        del buf[:at]
        return out

    def _hold_back(self, payload: bytes) -> bytes:
        joined = self._held + payload
        self._held = joined[-self._hold :]
        return joined[: -self._hold]

    def _finish(self) -> list[Chunk] | None:
        if not self._hold or not self._held:
            return None
        held, self._held = self._held, b""
        at = held.rfind(self._trailer)
        digits = held[at + len(self._trailer) :] if at >= 0 else b""
        if at >= 0 and digits.isdigit():
            self._trailer_code = int(digits)
            held = held[:at]
        return [("stderr", held)] if held else None

    async def send(self, data: bytes) -> bool:
        """Write ``data`` to stdin; False when the command no longer reads it."""
        view = memoryview(data)
        try:
            for start in range(0, len(view), _WRITE_BYTES):
                piece = bytes(view[start : start + _WRITE_BYTES])
                # Abandoned on cancellation: a command that never reads its stdin
                # would otherwise pin the caller; closing the pipe ends the thread.
                await anyio.to_thread.run_sync(
                    self._pipe.sendall,
                    piece,
                    limiter=anyio.CapacityLimiter(1),
                    abandon_on_cancel=True,
                )
        except OSError:
            return False
        return True

    async def close_stdin(self) -> None:
        """End stdin (EOF for the command). Idempotent."""
        if self._stdin_closed:
            return
        self._stdin_closed = True
        try:
            await anyio.to_thread.run_sync(self._pipe.shutdown_write)
        except OSError:
            return

    async def resize(self, size: TerminalSize) -> None:
        """Resize the exec's pseudo-terminal."""
        await self._call(
            "resize exec",
            lambda api: api.exec_resize(self.exec_id, height=size.rows, width=size.cols),
        )

    async def exit_code(self) -> int:
        """The exit status, once the streams ended.

        The trailer's status when it arrived; otherwise (no trailer asked
        for, or the stream ended without it: the wrapping ``sh`` was killed,
        or a child holding stderr wrote after it) the engine's record, see
        :func:`wait_exit_code`. Never None: an unknown status is an error.

        Raises:
            EngineError: The engine is unreachable, or never reported the
                exec ended.
        """
        if self._trailer_code is not None:
            return self._trailer_code
        return await wait_exit_code(self._call, self.exec_id)

    async def aclose(self) -> None:
        """Close the connection (wakes an abandoned read). Idempotent."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._pipe.close)


async def wait_exit_code(call: ApiCall, exec_id: str) -> int:
    """The exit status the engine records for an exec whose output stream ended.

    The attach stream closes when the command's stdout and stderr close,
    which is not the moment the engine records its exit: for an instant
    ``exec inspect`` still says ``Running`` with a null ``ExitCode`` (more
    often under load), and a command that closed its output may run on.
    So the record is polled, briefly and with backoff, until it shows an
    ended exec -- never read once and turned into "no status".

    Args:
        call: Runs a blocking function of the SDK's API client on a worker
            thread, translating its errors into :class:`EngineError`.
        exec_id: The exec.

    Raises:
        EngineError: The engine is unreachable, or still reports the exec
            running (or no status) after :data:`STATUS_POLLS` looks.
    """
    delay = _FIRST_POLL_S
    for _look in range(STATUS_POLLS):
        info = await call("inspect exec", lambda api: api.exec_inspect(exec_id))
        if isinstance(info, Mapping):
            code, running = info.get("ExitCode"), info.get("Running")
            if isinstance(code, int) and not isinstance(code, bool) and not running:
                return code
        await anyio.sleep(delay)
        delay = min(delay * 2, _LAST_POLL_S)
    raise EngineError(
        "exec: the engine reported no exit status; the command was still running after "
        "its output stream ended"
    )


async def open_attached(
    call: ApiCall,
    container_id: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    workdir: str,
    user: str,
    stdin: bool,
    terminal: TerminalSize | None = None,
    exit_trailer: bool = False,
) -> AttachedExec:
    """Create an exec, start it attached, and return its streams.

    Args:
        call: Runs a blocking function of the SDK's API client on a worker
            thread, translating its errors into :class:`EngineError`.
        container_id, argv, env, workdir, user, stdin, terminal, exit_trailer:
            See :meth:`AttachingEngine.attach_exec`.
    """
    nonce = secrets.token_hex(8) if exit_trailer and terminal is None else ""
    if nonce:
        argv = ["sh", "-c", _TRAILER_SH, "corral-exit", nonce, *argv]
    tty = terminal is not None

    handoff = _Handoff()

    def start(api: Any) -> str:
        created = api.exec_create(
            container_id,
            list(argv),
            stdout=True,
            stderr=True,
            stdin=stdin,
            tty=tty,
            environment=dict(env),
            workdir=workdir,
            user=user,
        )
        exec_id = str(created["Id"])
        response = api._post_json(
            api._url("/exec/{0}/start", exec_id),
            headers={"Connection": "Upgrade", "Upgrade": "tcp"},
            data={"Tty": tty, "Detach": False},
            stream=True,
        )
        try:
            api._raise_for_status(response)
            pipe = _Pipe(response)
        except BaseException:
            response.close()
            raise
        handoff.give(pipe)
        return exec_id

    # Abandoned on cancellation, so a wedged engine cannot hold a caller that
    # bounds its wait (killing a tree, a timeout); the handoff closes the pipe.
    try:
        exec_id = await call("attach exec", start, abandon=True)
    except BaseException:
        leftover = handoff.take()
        if leftover is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(leftover.close)
        raise
    pipe = handoff.take()
    if pipe is None:  # pragma: no cover - start returned, so it gave a pipe
        raise EngineError("attach exec: the started exec's stream went missing")
    trailer = f"\0corral-exit-{nonce}:".encode() if nonce else b""
    attached = AttachedExec(pipe, exec_id, call, tty=tty, trailer=trailer)
    if terminal is not None:
        # API 1.41 has no size at start: set it now (the program may see the
        # default size for its first instant, then a SIGWINCH).
        # A program that already ended fails the resize; its output is still readable.
        with contextlib.suppress(EngineError):
            await attached.resize(terminal)
    return attached
