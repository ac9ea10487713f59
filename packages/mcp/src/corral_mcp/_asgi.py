"""A small HTTP/1.1 server for one ASGI app, on anyio and h11.

uvicorn drives asyncio only, and corral's public I/O runs on trio too, so the
streamable HTTP transport is served by this loop instead: one task per
connection, keep-alive, chunked streaming (the SDK answers tool calls as
server-sent events), ``http.disconnect`` when the client goes away. It
serves exactly the needs of a loopback MCP endpoint; it is not a general
web server (no TLS, no HTTP/2, no websockets).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final
from urllib.parse import unquote

import anyio
import anyio.abc
import h11
from anyio.abc import SocketAttribute, SocketStream

__all__ = ["ASGIApp", "serve_asgi"]

log = logging.getLogger("corral.mcp.http")

Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[Message]],
        Callable[[Message], Awaitable[None]],
    ],
    Awaitable[None],
]

_CHUNK: Final = 1 << 16
_MAX_HEADER_BYTES: Final = 64 << 10
_IDLE_TIMEOUT_S: Final = 120.0
"""A kept-alive connection with no new request for this long is closed."""
_MAX_PIPELINED: Final = 1 << 20
_CONNECTION_ERRORS: Final = (
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
)


class _ClientGone(OSError):
    """Sending failed because the client closed the connection."""


class _Connection:
    def __init__(self, stream: SocketStream, app: ASGIApp) -> None:
        self.stream = stream
        self.app = app
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEADER_BYTES)
        self.client = _address(stream, SocketAttribute.remote_address)
        self.server = _address(stream, SocketAttribute.local_address)

    async def serve(self) -> None:
        while True:
            event: Any = None
            with anyio.move_on_after(_IDLE_TIMEOUT_S):
                event = await self.next_event()
            if isinstance(event, h11.Request):
                await self._exchange(event)
            else:
                return
            if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
                return
            self.h11.start_next_cycle()

    async def next_event(self) -> Any:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            try:
                data = await self.stream.receive(_CHUNK)
            except _CONNECTION_ERRORS:
                data = b""
            self.h11.receive_data(data)

    async def write(self, event: Any) -> None:
        data = self.h11.send(event)
        if data:
            try:
                await self.stream.send(data)
            except _CONNECTION_ERRORS as exc:
                raise _ClientGone("the client disconnected") from exc

    async def watch_disconnect(self, gone: anyio.Event) -> None:
        # Reading on while the response streams is how a closed connection is
        # noticed; bytes of a pipelined next request wait in h11's buffer.
        while True:
            try:
                data = await self.stream.receive(_CHUNK)
            except _CONNECTION_ERRORS:
                data = b""
            self.h11.receive_data(data)
            if not data or len(self.h11.trailing_data[0]) > _MAX_PIPELINED:
                gone.set()
                return

    async def _exchange(self, request: h11.Request) -> None:
        exchange = _Exchange(self, request)
        async with anyio.create_task_group() as tg:
            exchange.task_group = tg
            try:
                await self.app(exchange.scope(), exchange.receive, exchange.send)
            except _ClientGone:
                log.debug("client disconnected during %s", exchange.label)
            except Exception:
                log.exception("the MCP HTTP app raised on %s", exchange.label)
                if not exchange.started:
                    await self._send_plain(500, b"internal server error\n")
            else:
                if not exchange.started:
                    log.error("the MCP HTTP app sent no response to %s", exchange.label)
                    await self._send_plain(500, b"internal server error\n")
            tg.cancel_scope.cancel()

    async def _send_plain(self, status: int, body: bytes) -> None:
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        try:
            await self.write(h11.Response(status_code=status, headers=headers))
            await self.write(h11.Data(data=body))
            await self.write(h11.EndOfMessage())
        except (_ClientGone, h11.LocalProtocolError):
            pass

    async def reject(self, exc: h11.RemoteProtocolError) -> None:
        if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            await self._send_plain(exc.error_status_hint, b"bad request\n")


class _Exchange:
    """One request and its response, as the ASGI app sees them."""

    def __init__(self, connection: _Connection, request: h11.Request) -> None:
        self.connection = connection
        self.request = request
        self.task_group: anyio.abc.TaskGroup | None = None
        self.body_done = False
        self.started = False
        self.finished = False
        self.gone = anyio.Event()
        """Set when the client disconnected or the response is complete."""
        self.label = f"{request.method.decode('ascii', 'replace')} {request.target[:200]!r}"

    def scope(self) -> dict[str, Any]:
        raw_path, _, query = self.request.target.partition(b"?")
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": self.request.http_version.decode("ascii"),
            "method": self.request.method.decode("ascii"),
            "scheme": "http",
            "path": unquote(raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": [(name.lower(), value) for name, value in self.request.headers],
            "client": self.connection.client,
            "server": self.connection.server,
        }

    async def receive(self) -> Message:
        conn = self.connection
        if self.body_done or self.gone.is_set():
            await self.gone.wait()
            return {"type": "http.disconnect"}
        if conn.h11.they_are_waiting_for_100_continue:
            await conn.write(h11.InformationalResponse(status_code=100, headers=[]))
        event = await conn.next_event()
        if isinstance(event, h11.Data):
            return {"type": "http.request", "body": bytes(event.data), "more_body": True}
        if isinstance(event, h11.EndOfMessage):
            self.body_done = True
            assert self.task_group is not None
            self.task_group.start_soon(conn.watch_disconnect, self.gone)
            return {"type": "http.request", "body": b"", "more_body": False}
        self.gone.set()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        conn = self.connection
        kind = message["type"]
        if kind == "http.response.start" and not self.started:
            self.started = True
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
            await conn.write(h11.Response(status_code=message["status"], headers=headers))
        elif kind == "http.response.body" and self.started and not self.finished:
            body = bytes(message.get("body", b""))
            if body:
                await conn.write(h11.Data(data=body))
            if not message.get("more_body", False):
                self.finished = True
                await conn.write(h11.EndOfMessage())
                self.gone.set()
        elif kind in ("http.response.start", "http.response.body"):
            raise RuntimeError(f"ASGI message {kind!r} out of order")


def _address(stream: SocketStream, attribute: Any) -> tuple[str, int] | None:
    address = stream.extra(attribute, None)  # noqa: S610 - anyio typed attributes, not Django
    if isinstance(address, tuple) and len(address) >= 2:
        return str(address[0]), int(address[1])
    return None


async def _handle(app: ASGIApp, stream: SocketStream) -> None:
    connection = _Connection(stream, app)
    try:
        await connection.serve()
    except h11.RemoteProtocolError as exc:
        await connection.reject(exc)
    except Exception:
        # One broken connection must never stop the listener.
        log.exception("HTTP connection failed")
    finally:
        await stream.aclose()


async def serve_asgi(
    app: ASGIApp,
    host: str,
    port: int,
    *,
    task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` until cancelled.

    Args:
        app: The ASGI application (HTTP scope only; no lifespan events are sent).
        host: An IP address to bind.
        port: The TCP port (0 picks a free one).
        task_status: Receives the bound ``(host, port)`` once accepting.
    """
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
    async with listener:
        bound = listener.listeners[0].extra(SocketAttribute.local_address)  # noqa: S610
        task_status.started((str(bound[0]), int(bound[1])))

        async def handle(stream: SocketStream) -> None:
            await _handle(app, stream)

        await listener.serve(handle)
