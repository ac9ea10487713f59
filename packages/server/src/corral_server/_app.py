"""The HTTP API: a plain ASGI app over :class:`WorkspaceService` (JSON in, JSON out).

Every route but ``/v1/health`` needs ``Authorization: Bearer <token>``; the
token decides the project and every lookup is scoped to it. Bodies are
capped (``max_body_bytes``; 413 past it, read no further), must be JSON
objects, and every field is type-checked by the service before use. Errors
are ``{"error": {"code", "message"}}`` with messages that never repeat what
the client sent.

Streams: ``GET .../handles/{h}/read`` returns one chunk (base64) after a
cursor; ``GET .../handles/{h}/events`` follows a stream as server-sent
events whose ``id`` is the byte cursor after the event's data, so a client
that reconnects with ``Last-Event-ID`` resumes exactly where it stopped.
Comment lines (``: keepalive``) keep idle connections alive.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final
from urllib.parse import parse_qsl

import anyio

from corral.provider import ProcessRequest, TerminalSize

from ._errors import ServiceError
from ._model import check_bool, check_int, check_mapping, check_number, check_str
from ._service import WorkspaceService

__all__ = ["ApiApp"]

log = logging.getLogger("corral.server.http")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

DEFAULT_MAX_BODY: Final = 1 << 20
_MAX_QUERY: Final = 8192
_WS: Final = r"(?P<ws>[^/]{1,80})"
_H: Final = r"(?P<h>[^/]{1,80})"


class _Request:
    def __init__(self, scope: Scope, project: str, body: bytes) -> None:
        self.scope = scope
        self.project = project
        self.raw = body
        query = scope.get("query_string", b"")
        if len(query) > _MAX_QUERY:
            raise ServiceError("the query string is too long")
        try:
            pairs = parse_qsl(query.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            raise ServiceError("the query string is not UTF-8") from None
        self.query: dict[str, str] = {}
        for key, value in pairs:
            if key in self.query:
                raise ServiceError("a query parameter is repeated")
            self.query[key] = value
        self.headers = {k.decode("latin-1"): v for k, v in scope.get("headers", [])}

    def json(self) -> dict[str, Any]:
        if not self.raw:
            return {}
        kind = self.headers.get("content-type", b"").split(b";")[0].strip().lower()
        if kind != b"application/json":
            raise ServiceError("the body must be application/json", code="unsupported")
        try:
            value = json.loads(self.raw, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            raise ServiceError("the body is not valid JSON") from None
        return check_mapping(value, "the body")

    def q_int(self, name: str, default: int, *, lo: int, hi: int) -> int:
        text = self.query.get(name)
        if text is None:
            return default
        if not re.fullmatch(r"[0-9]{1,19}", text):
            raise ServiceError(f"{name} must be a non-negative integer")
        return check_int(int(text), name, lo=lo, hi=hi)

    def q_float(self, name: str, default: float, *, hi: float) -> float:
        text = self.query.get(name)
        if text is None:
            return default
        if not re.fullmatch(r"[0-9]{1,6}(\.[0-9]{1,6})?", text):
            raise ServiceError(f"{name} must be a non-negative number")
        return check_number(float(text), name, lo=0.0, hi=hi)


def _no_constant(_name: str) -> None:
    raise ValueError("NaN and Infinity are not JSON")


Handler = Callable[[_Request, dict[str, str]], Awaitable[Any]]


class ApiApp:
    """The ASGI application.

    Args:
        service: The service every route calls.
        max_body_bytes: Largest request body accepted.
        keepalive_s: Seconds between keepalive comments on an idle event stream.
    """

    def __init__(
        self,
        service: WorkspaceService,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY,
        keepalive_s: float = 15.0,
    ) -> None:
        self.service = service
        self.max_body_bytes = max_body_bytes
        self.keepalive_s = keepalive_s
        s = self
        self.routes: list[tuple[str, re.Pattern[str], Handler]] = [
            ("POST", re.compile(r"/v1/workspaces"), s._create),
            ("GET", re.compile(r"/v1/workspaces"), s._list),
            ("GET", re.compile(rf"/v1/workspaces/{_WS}"), s._get),
            ("PATCH", re.compile(rf"/v1/workspaces/{_WS}"), s._update),
            ("DELETE", re.compile(rf"/v1/workspaces/{_WS}"), s._delete),
            ("POST", re.compile(rf"/v1/workspaces/{_WS}/archive"), s._archive),
            ("POST", re.compile(rf"/v1/workspaces/{_WS}/materialize"), s._materialize),
            ("POST", re.compile(rf"/v1/workspaces/{_WS}/connect"), s._connect),
            ("POST", re.compile(rf"/v1/workspaces/{_WS}/stop"), s._stop),
            ("GET", re.compile(rf"/v1/workspaces/{_WS}/versions"), s._versions),
            ("POST", re.compile(rf"/v1/workspaces/{_WS}/versions"), s._take_version),
            ("POST", re.compile(rf"/v1/workspaces/{_WS}/versions/prune"), s._prune),
            ("GET", re.compile(rf"/v1/workspaces/{_WS}/files/read"), s._read_file),
            ("GET", re.compile(rf"/v1/workspaces/{_WS}/files/ls"), s._ls),
            ("GET", re.compile(rf"/v1/workspaces/{_WS}/files/stat"), s._stat),
            ("POST", re.compile(rf"/v1/workspaces/{_WS}/live/fs"), s._live_fs),
            ("POST", re.compile(rf"/v1/workspaces/{_WS}/exec"), s._exec),
            ("POST", re.compile(rf"/v1/workspaces/{_WS}/pty"), s._pty),
            ("GET", re.compile(rf"/v1/workspaces/{_WS}/handles"), s._handles),
            ("GET", re.compile(rf"/v1/workspaces/{_WS}/handles/{_H}"), s._handle),
            ("GET", re.compile(rf"/v1/workspaces/{_WS}/handles/{_H}/read"), s._read),
            ("GET", re.compile(rf"/v1/workspaces/{_WS}/handles/{_H}/events"), s._events),
            ("POST", re.compile(rf"/v1/workspaces/{_WS}/handles/{_H}/stdin"), s._stdin),
            ("POST", re.compile(rf"/v1/workspaces/{_WS}/handles/{_H}/signal"), s._signal),
            ("POST", re.compile(rf"/v1/workspaces/{_WS}/handles/{_H}/resize"), s._resize),
            ("POST", re.compile(rf"/v1/workspaces/{_WS}/handles/{_H}/wait"), s._wait),
            ("POST", re.compile(rf"/v1/workspaces/{_WS}/handles/{_H}/kill"), s._kill),
        ]

    # -- ASGI ---------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one HTTP request (lifespan events are acknowledged and ignored)."""
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        try:
            await self._dispatch(scope, receive, send)
        except ServiceError as exc:
            # After an oversized body the connection's state is not worth trusting.
            close = exc.code == "too_large"
            await _send_json(send, exc.status, exc.body(), close=close)
        except Exception:
            log.exception("request failed")
            err = ServiceError("internal error", code="failed")
            await _send_json(send, 500, err.body())

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path == "/v1/health" and method == "GET":
            await _send_json(send, 200, {"ok": True, "store": self.service.store.kind})
            return
        match = None
        allowed = False
        handler: Handler | None = None
        for verb, pattern, fn in self.routes:
            m = pattern.fullmatch(path)
            if m is not None:
                allowed = True
                if verb == method:
                    match, handler = m, fn
                    break
        if handler is None or match is None:
            code = "invalid_argument" if allowed else "not_found"
            status_msg = "method not allowed" if allowed else "no such route"
            err = ServiceError(status_msg, code=code)
            await _send_json(send, 405 if allowed else 404, err.body())
            return
        project = await self.service.authenticate(_bearer(scope))
        body = await self._body(scope, receive)
        request = _Request(scope, project, body)
        result = await handler(request, match.groupdict())
        if isinstance(result, _Raw):
            await result.send(send)
        elif isinstance(result, _Events):
            await self._stream_events(result, request, receive, send)
        else:
            await _send_json(send, 200, result)

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body_bytes):
            await self._drain(receive, {"more_body": True})
            raise ServiceError(
                f"the body is larger than {self.max_body_bytes} bytes", code="too_large"
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._drain(receive, message)
                raise ServiceError(
                    f"the body is larger than {self.max_body_bytes} bytes", code="too_large"
                )
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _drain(self, receive: Receive, message: MutableMapping[str, Any]) -> None:
        """Discard the rest of an oversized body (bounded), so the client reads the 413.

        A client sends its whole body before it reads the answer; a server
        that stops reading leaves both waiting. Past the bound, or after a
        few seconds, the answer is sent anyway.
        """
        left = 16 * self.max_body_bytes
        with anyio.move_on_after(5.0):
            while message.get("more_body", False) and left > 0:
                message = await receive()
                if message["type"] != "http.request":
                    return
                left -= len(message.get("body", b""))

    # -- workspaces ---------------------------------------------------------------

    def _ws_json(self, rec: Any) -> dict[str, Any]:
        return dict(rec.to_json(live=self.service.is_live(rec.id)))

    async def _create(self, req: _Request, p: dict[str, str]) -> Any:
        return self._ws_json(await self.service.create(req.project, req.json()))

    async def _list(self, req: _Request, p: dict[str, str]) -> Any:
        limit = req.q_int("limit", 50, lo=1, hi=500)
        tag = req.query.get("tag")
        state = req.query.get("state")
        if state is not None and state not in ("active", "archived"):
            raise ServiceError("state must be active or archived")
        cursor = req.query.get("cursor")
        if cursor is not None and not re.fullmatch(r"ws-[0-9a-f]{32}", cursor):
            raise ServiceError("cursor is not a valid cursor")
        if tag is not None:
            check_str(tag, "tag", max_len=64)
        recs = await self.service.store.list_workspaces(
            req.project, tag=tag, state=state, after=cursor, limit=limit + 1
        )
        more = len(recs) > limit
        recs = recs[:limit]
        return {
            "workspaces": [self._ws_json(r) for r in recs],
            "next_cursor": recs[-1].id if more else None,
        }

    async def _get(self, req: _Request, p: dict[str, str]) -> Any:
        return self._ws_json(await self.service.get(req.project, p["ws"]))

    async def _update(self, req: _Request, p: dict[str, str]) -> Any:
        return self._ws_json(await self.service.update(req.project, p["ws"], req.json()))

    async def _delete(self, req: _Request, p: dict[str, str]) -> Any:
        await self.service.delete(req.project, p["ws"])
        return {"deleted": True}

    async def _archive(self, req: _Request, p: dict[str, str]) -> Any:
        return self._ws_json(await self.service.archive(req.project, p["ws"]))

    async def _materialize(self, req: _Request, p: dict[str, str]) -> Any:
        return await self.service.materialize(req.project, p["ws"])

    async def _connect(self, req: _Request, p: dict[str, str]) -> Any:
        return await self.service.connect(req.project, p["ws"])

    async def _stop(self, req: _Request, p: dict[str, str]) -> Any:
        return await self.service.stop(req.project, p["ws"])

    async def _versions(self, req: _Request, p: dict[str, str]) -> Any:
        vs = await self.service.versions(req.project, p["ws"])
        return {"versions": [v.to_json() for v in vs]}

    async def _take_version(self, req: _Request, p: dict[str, str]) -> Any:
        return (await self.service.take_version(req.project, p["ws"])).to_json()

    async def _prune(self, req: _Request, p: dict[str, str]) -> Any:
        body = req.json()
        if set(body) - {"keep"}:
            raise ServiceError("the request has an unknown field")
        removed = await self.service.prune_versions(req.project, p["ws"], body.get("keep"))
        return {"removed": removed}

    # -- files --------------------------------------------------------------------

    def _source(self, req: _Request) -> dict[str, Any]:
        return {"source": req.query.get("source"), "version_id": req.query.get("version_id")}

    async def _read_file(self, req: _Request, p: dict[str, str]) -> Any:
        data = await self.service.read_file(
            req.project,
            p["ws"],
            req.query.get("path"),
            max_bytes=req.q_int("max_bytes", 16 << 20, lo=0, hi=16 << 20),
            **self._source(req),
        )
        return _Raw(data)

    async def _ls(self, req: _Request, p: dict[str, str]) -> Any:
        entries = await self.service.ls(
            req.project, p["ws"], req.query.get("path", "/"), **self._source(req)
        )
        return {"entries": entries}

    async def _stat(self, req: _Request, p: dict[str, str]) -> Any:
        return await self.service.stat(
            req.project, p["ws"], req.query.get("path"), **self._source(req)
        )

    async def _live_fs(self, req: _Request, p: dict[str, str]) -> Any:
        return await self.service.live_fs(req.project, p["ws"], req.json())

    # -- handles ------------------------------------------------------------------

    def _process_request(self, body: dict[str, Any], *, pty: bool) -> ProcessRequest:
        allowed = {"command", "cwd", "env", "timeout_s", "retained_bytes", "cols", "rows"}
        allowed |= {"allowed_commands", "allow_shell_syntax"}
        if not pty:
            allowed -= {"cols", "rows"}
        if set(body) - allowed:
            raise ServiceError("the request has an unknown field")
        default = "/bin/sh" if pty else None
        command = check_str(body.get("command", default), "command", max_len=65536)
        cwd = body.get("cwd")
        if cwd is not None:
            cwd = check_str(cwd, "cwd", max_len=4096)
        env = check_mapping(body.get("env", {}), "env")
        if len(env) > 256:
            raise ServiceError("env holds more than 256 variables")
        for key, value in env.items():
            check_str(key, "an env name", max_len=256)
            check_str(value, "an env value", max_len=65536, empty=True)
        timeout = body.get("timeout_s")
        if timeout is not None:
            timeout = check_number(timeout, "timeout_s", lo=0.001, hi=7 * 86400)
        retained = check_int(
            body.get("retained_bytes", 8 << 20), "retained_bytes", lo=1024, hi=256 << 20
        )
        # A client may narrow what its own token could run anyway (the box's
        # guard enforces it): corral mcp --workspace passes the shell policy here.
        names = body.get("allowed_commands")
        if names is not None:
            if not isinstance(names, list) or len(names) > 1024:
                raise ServiceError("allowed_commands must be a list of at most 1024 names")
            names = frozenset(check_str(n, "a command name", max_len=256) for n in names)
        shell_syntax = check_bool(body.get("allow_shell_syntax", True), "allow_shell_syntax")
        terminal = None
        if pty:
            terminal = TerminalSize(
                cols=check_int(body.get("cols", 80), "cols", lo=1, hi=1000),
                rows=check_int(body.get("rows", 24), "rows", lo=1, hi=1000),
            )
        return ProcessRequest(
            command=command,
            cwd=cwd,
            env=env,
            terminal=terminal,
            timeout_s=timeout,
            retained_bytes=retained,
            allowed_commands=names,
            allow_shell_syntax=shell_syntax,
        )

    async def _exec(self, req: _Request, p: dict[str, str]) -> Any:
        request = self._process_request(req.json(), pty=False)
        return (await self.service.start_process(req.project, p["ws"], request, "exec")).to_json()

    async def _pty(self, req: _Request, p: dict[str, str]) -> Any:
        request = self._process_request(req.json(), pty=True)
        return (await self.service.start_process(req.project, p["ws"], request, "pty")).to_json()

    async def _handles(self, req: _Request, p: dict[str, str]) -> Any:
        hs = await self.service.handles(req.project, p["ws"])
        return {"handles": [h.to_json() for h in hs]}

    async def _handle(self, req: _Request, p: dict[str, str]) -> Any:
        return (await self.service.handle_info(req.project, p["ws"], p["h"])).to_json()

    def _stream(self, req: _Request) -> str:
        stream = req.query.get("stream", "stdout")
        if stream not in ("stdout", "stderr"):
            raise ServiceError("stream must be stdout or stderr")
        return stream

    async def _read(self, req: _Request, p: dict[str, str]) -> Any:
        chunk = await self.service.read(
            req.project,
            p["ws"],
            p["h"],
            stream=self._stream(req),
            cursor=req.q_int("cursor", 0, lo=0, hi=1 << 62),
            max_bytes=req.q_int("max_bytes", 65536, lo=1, hi=1 << 20),
            wait_s=req.q_float("wait_s", 0.0, hi=60.0),
        )
        return {
            "data": base64.b64encode(chunk.data).decode("ascii"),
            "cursor": chunk.cursor,
            "next_cursor": chunk.next_cursor,
            "ended": chunk.ended,
        }

    async def _stdin(self, req: _Request, p: dict[str, str]) -> Any:
        body = req.json()
        if set(body) - {"data", "text", "close"}:
            raise ServiceError("the request has an unknown field")
        data = b""
        if "data" in body:
            try:
                data = base64.b64decode(
                    check_str(body["data"], "data", max_len=1 << 20), validate=True
                )
            except ValueError:
                raise ServiceError("data must be base64") from None
        if "text" in body:
            data += check_str(body["text"], "text", max_len=1 << 20, empty=True).encode()
        close = check_bool(body.get("close", False), "close")
        h = await self.service.control(
            req.project, p["ws"], p["h"], "stdin", data=data, close=close
        )
        return h.to_json()

    async def _signal(self, req: _Request, p: dict[str, str]) -> Any:
        body = req.json()
        sig = check_int(body.get("signal", 15), "signal", lo=1, hi=64)
        return (
            await self.service.control(req.project, p["ws"], p["h"], "signal", signal=sig)
        ).to_json()

    async def _resize(self, req: _Request, p: dict[str, str]) -> Any:
        body = req.json()
        size = TerminalSize(
            cols=check_int(body.get("cols"), "cols", lo=1, hi=1000),
            rows=check_int(body.get("rows"), "rows", lo=1, hi=1000),
        )
        return (
            await self.service.control(req.project, p["ws"], p["h"], "resize", size=size)
        ).to_json()

    async def _wait(self, req: _Request, p: dict[str, str]) -> Any:
        body = req.json()
        timeout = check_number(body.get("timeout_s", 30.0), "timeout_s", lo=0.0, hi=300.0)
        h = await self.service.control(req.project, p["ws"], p["h"], "wait", timeout_s=timeout)
        return h.to_json()

    async def _kill(self, req: _Request, p: dict[str, str]) -> Any:
        return (await self.service.control(req.project, p["ws"], p["h"], "kill")).to_json()

    # -- server-sent events -------------------------------------------------------

    async def _events(self, req: _Request, p: dict[str, str]) -> Any:
        stream = self._stream(req)
        last = req.headers.get("last-event-id")
        if last is not None:
            text = last.decode("latin-1").strip()
            if not re.fullmatch(r"[0-9]{1,19}", text):
                raise ServiceError("Last-Event-ID must be a byte cursor")
            cursor = int(text)
        else:
            cursor = req.q_int("cursor", 0, lo=0, hi=1 << 62)
        # Fail before the stream starts (unknown handle, expired cursor...).
        await self.service.read(
            req.project, p["ws"], p["h"], stream=stream, cursor=cursor, max_bytes=1, wait_s=0.0
        )
        return _Events(p["ws"], p["h"], stream, cursor)

    async def _stream_events(
        self, events: _Events, req: _Request, receive: Receive, send: Send
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            await self._pump(events, req, send)
            tg.cancel_scope.cancel()
        with anyio.CancelScope(shield=True):
            try:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except Exception:  # the client is gone: nothing to finish
                log.debug("event stream closed by the client")

    async def _pump(self, events: _Events, req: _Request, send: Send) -> None:
        cursor = events.cursor
        while True:
            try:
                chunk = await self.service.read(
                    req.project,
                    events.ws,
                    events.h,
                    stream=events.stream,
                    cursor=cursor,
                    max_bytes=65536,
                    wait_s=self.keepalive_s,
                )
            except ServiceError as exc:
                payload = json.dumps(exc.body()["error"], separators=(",", ":"))
                await _send_sse(send, f"event: error\ndata: {payload}\n\n")
                return
            if chunk.data:
                data = base64.b64encode(chunk.data).decode("ascii")
                await _send_sse(send, f"id: {chunk.next_cursor}\nevent: data\ndata: {data}\n\n")
            elif not chunk.ended:
                await _send_sse(send, ": keepalive\n\n")
            cursor = chunk.next_cursor
            if chunk.ended:
                h = await self.service.handle_info(req.project, events.ws, events.h)
                payload = json.dumps(h.to_json(), separators=(",", ":"))
                await _send_sse(send, f"id: {cursor}\nevent: end\ndata: {payload}\n\n")
                return


class _Raw:
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def send(self, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/octet-stream"),
                    (b"content-length", str(len(self.data)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": self.data})


class _Events:
    def __init__(self, ws: str, h: str, stream: str, cursor: int) -> None:
        self.ws, self.h, self.stream, self.cursor = ws, h, stream, cursor


def _bearer(scope: Scope) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == b"authorization":
            text = value.decode("latin-1")
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer":
                return str(token.strip())
    return None


async def _send_json(send: Send, status: int, body: Any, *, close: bool = False) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _send_sse(send: Send, text: str) -> None:
    await send({"type": "http.response.body", "body": text.encode(), "more_body": True})
