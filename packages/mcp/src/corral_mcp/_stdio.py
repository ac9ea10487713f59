"""A cancellable stdio transport.

The SDK's ``stdio_server`` reads stdin in a worker thread, which no
cancellation can interrupt: a SIGTERM with stdin still open would hang the
server and skip closing the workspace. This transport polls the pipes
instead (``anyio.wait_readable``), so shutdown is prompt on trio and asyncio.

While serving, fd 0 points at ``/dev/null`` and fd 1 at stderr (as the SDK
does), so a stray ``print`` or a child process cannot corrupt the JSON-RPC
wire; the wire lives on private close-on-exec duplicates. Both are restored
on exit.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Final

import anyio
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import types
from mcp.shared.message import SessionMessage

__all__ = ["stdio_streams"]

_ReadStream = MemoryObjectReceiveStream[SessionMessage | Exception]
_WriteStream = MemoryObjectSendStream[SessionMessage]

log = logging.getLogger("corral.mcp")

_CHUNK: Final = 1 << 16
_MAX_LINE: Final = 64 << 20
"""A JSON-RPC line longer than this is dropped rather than buffered without end."""
_FLUSH_TIMEOUT_S: Final = 2.0


class _Wire:
    """One end of the wire on a private fd: polled when it is a pipe or socket."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        mode = os.fstat(fd).st_mode
        # epoll refuses regular files and /dev/null: those never block, so a
        # worker thread serves them; a tty keeps blocking reads in a thread too.
        self.pollable = stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)
        self._was_blocking = os.get_blocking(fd)
        if self.pollable:
            os.set_blocking(fd, False)

    async def read(self) -> bytes:
        if not self.pollable:
            return await anyio.to_thread.run_sync(os.read, self.fd, _CHUNK)
        while True:
            await anyio.wait_readable(self.fd)
            try:
                return os.read(self.fd, _CHUNK)
            except BlockingIOError:
                continue

    async def write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.pollable:
                await anyio.wait_writable(self.fd)
                try:
                    written = os.write(self.fd, view)
                except BlockingIOError:
                    continue
            else:
                written = await anyio.to_thread.run_sync(os.write, self.fd, view)
            view = view[written:]

    def release(self) -> None:
        with suppress(OSError):
            os.set_blocking(self.fd, self._was_blocking)
        with suppress(OSError):
            os.close(self.fd)


def _divert(fd: int, to_fd: int) -> int:
    """Move the wire on ``fd`` to a private duplicate and point ``fd`` at ``to_fd``."""
    private = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.dup2(to_fd, fd)
    return private


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


async def _pump_in(wire: _Wire, send: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
    async with send:
        buffer = b""
        while chunk := await wire.read():
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    await send.send(_parse(line))
            if len(buffer) > _MAX_LINE:
                log.warning("dropped a stdin line longer than %d bytes", _MAX_LINE)
                await send.send(ValueError("message too long"))
                buffer = b""
        if buffer.strip():
            await send.send(_parse(buffer))
    log.debug("stdin closed")


async def _pump_out(
    wire: _Wire, receive: MemoryObjectReceiveStream[SessionMessage], done: anyio.Event
) -> None:
    try:
        async with receive:
            async for message in receive:
                text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await wire.write_all(text.encode() + b"\n")
    except OSError:
        # The reader is gone (broken pipe): nothing more can be delivered.
        log.debug("stdout closed by the client")
    finally:
        done.set()


@asynccontextmanager
async def stdio_streams() -> AsyncIterator[tuple[_ReadStream, _WriteStream]]:
    """The process's stdin/stdout as the MCP message streams a server runs on.

    Yields:
        ``(read_stream, write_stream)`` for ``Server.run``. The read stream
        ends when stdin reaches end of file (the client went away).
    """
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        in_fd = _divert(0, devnull)
        try:
            out_fd = _divert(1, 2)
        except OSError:
            os.dup2(in_fd, 0)
            os.close(in_fd)
            raise
    finally:
        os.close(devnull)
    wire_in, wire_out = _Wire(in_fd), _Wire(out_fd)
    read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](0)
    flushed = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_pump_in, wire_in, read_send)
            tg.start_soon(_pump_out, wire_out, write_receive, flushed)
            try:
                yield read_receive, write_send
            finally:
                # Let the last responses reach the client, but never wait on a
                # client that stopped reading.
                write_send.close()
                with anyio.move_on_after(_FLUSH_TIMEOUT_S, shield=True):
                    await flushed.wait()
                tg.cancel_scope.cancel()
    finally:
        with suppress(OSError):
            os.dup2(wire_in.fd, 0)
        with suppress(OSError):
            os.dup2(wire_out.fd, 1)
        wire_in.release()
        wire_out.release()
