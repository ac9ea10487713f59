"""Python clients of the API: :class:`AsyncClient` (trio or asyncio) and :class:`Client` (blocking).

Both build the same requests (one table of calls, :class:`_Calls`) and raise
:class:`ApiError` for an error answer, with the server's code and message.
:meth:`AsyncClient.follow` reads a handle's stream as server-sent events and
reconnects with ``Last-Event-ID`` when the connection drops, so no byte is
lost or repeated.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, cast

import httpx

from corral import ConfigError

__all__ = ["DEFAULT_URL", "ApiError", "AsyncClient", "Client", "StreamEvent", "client_settings"]

DEFAULT_URL: Final = "http://127.0.0.1:8420"
"""Where a local ``corral serve`` listens by default."""


def client_settings(
    url: str | None = None, token: str | None = None, data: Path | None = None
) -> tuple[str, str]:
    """The server URL and token a command-line client uses: ``(url, token)``.

    Given values first, then ``CORRAL_SERVER_URL`` (default
    ``http://127.0.0.1:8420``) and ``CORRAL_SERVER_TOKEN``, then the token
    file a local ``corral serve`` writes in its data directory (``data``, or
    ``$CORRAL_SERVER_DATA``, or ``~/.local/state/corral/server``).

    Raises:
        ConfigError: No token anywhere.
    """
    url = url or os.environ.get("CORRAL_SERVER_URL") or DEFAULT_URL
    token = token or os.environ.get("CORRAL_SERVER_TOKEN")
    if not token:
        folder = data or Path(
            os.environ.get("CORRAL_SERVER_DATA")
            or Path.home() / ".local" / "state" / "corral" / "server"
        )
        try:
            token = (folder / "token").read_text().strip()
        except OSError:
            raise ConfigError("no token: set CORRAL_SERVER_TOKEN or pass --token") from None
    return url, token


class ApiError(Exception):
    """An error answer of the API.

    Attributes:
        status: The HTTP status.
        code: The service's error code (``not_found``, ``cursor_expired``...).
        message: The service's message.
        details: Other fields of the error (``earliest`` of ``cursor_expired``).
    """

    def __init__(self, status: int, code: str, message: str, details: Mapping[str, Any]) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = dict(details)


class StreamEvent:
    """One event of a followed stream.

    Attributes:
        kind: ``data`` or ``end``.
        data: The bytes (``data`` events).
        cursor: The cursor after this event (resume from here).
        info: The handle's final info (``end`` events).
    """

    def __init__(self, kind: str, data: bytes, cursor: int, info: Mapping[str, Any]) -> None:
        self.kind = kind
        self.data = data
        self.cursor = cursor
        self.info = dict(info)

    def __repr__(self) -> str:
        return f"StreamEvent({self.kind!r}, {len(self.data)} bytes, cursor={self.cursor})"


def _check(response: httpx.Response) -> httpx.Response:
    if response.status_code < 400:
        return response
    try:
        err = response.json()["error"]
        code, message = str(err.pop("code")), str(err.pop("message"))
    except (ValueError, KeyError, TypeError):
        code, message, err = "failed", f"HTTP {response.status_code}", {}
    raise ApiError(response.status_code, code, message, err)


class _Calls:
    """Method, path, query and body of each call (shared by both clients)."""

    @staticmethod
    def ws(workspace_id: str, tail: str = "") -> str:
        return f"/v1/workspaces/{workspace_id}{tail}"

    @staticmethod
    def source(
        path: str, source: str | None, version_id: str | None, **more: Any
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"path": path, **more}
        if source is not None:
            params["source"] = source
        if version_id is not None:
            params["version_id"] = version_id
            params.setdefault("source", "version")
        return params


class AsyncClient:
    """An async client (anyio: trio or asyncio).

    Args:
        base_url: ``http://127.0.0.1:8420`` (or ``https://...``).
        token: The project's bearer token.
        timeout_s: Per-request timeout (long-polls add their wait).
        verify: TLS verification (a CA bundle path, or False for tests only).
    """

    def __init__(
        self, base_url: str, token: str, *, timeout_s: float = 60.0, verify: bool | str = True
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers={"authorization": f"Bearer {token}"},
            timeout=timeout_s,
            verify=verify,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        return _check(await self._http.request(method, path, **kw)).json()

    async def create(
        self,
        sandbox: Mapping[str, Any],
        *,
        metadata: Mapping[str, Any] | None = None,
        tags: list[str] | None = None,
    ) -> dict[str, Any]:
        """Create a workspace pinned to ``sandbox`` (``{"provider": ..., ...}``)."""
        body = {"sandbox": dict(sandbox), "metadata": dict(metadata or {}), "tags": tags or []}
        return dict(await self._json("POST", "/v1/workspaces", json=body))

    async def get(self, workspace_id: str) -> dict[str, Any]:
        """A workspace's record."""
        return dict(await self._json("GET", _Calls.ws(workspace_id)))

    async def list_workspaces(
        self,
        *,
        tag: str | None = None,
        state: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> dict[str, Any]:
        """A page of workspaces: ``{"workspaces": [...], "next_cursor": ...}``."""
        params: dict[str, Any] = {"limit": limit}
        for key, value in (("tag", tag), ("state", state), ("cursor", cursor)):
            if value is not None:
                params[key] = value
        return dict(await self._json("GET", "/v1/workspaces", params=params))

    async def update(
        self,
        workspace_id: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        tags: list[str] | None = None,
    ) -> dict[str, Any]:
        """Replace metadata and/or tags."""
        body: dict[str, Any] = {}
        if metadata is not None:
            body["metadata"] = dict(metadata)
        if tags is not None:
            body["tags"] = tags
        return dict(await self._json("PATCH", _Calls.ws(workspace_id), json=body))

    async def archive(self, workspace_id: str) -> dict[str, Any]:
        """Stop and archive a workspace."""
        return dict(await self._json("POST", _Calls.ws(workspace_id, "/archive")))

    async def delete(self, workspace_id: str) -> None:
        """Delete a workspace."""
        await self._json("DELETE", _Calls.ws(workspace_id))

    async def materialize(self, workspace_id: str) -> dict[str, Any]:
        """Prepare the live box."""
        return dict(await self._json("POST", _Calls.ws(workspace_id, "/materialize")))

    async def connect(self, workspace_id: str) -> dict[str, Any]:
        """The live box, materialised when needed."""
        return dict(await self._json("POST", _Calls.ws(workspace_id, "/connect")))

    async def stop(self, workspace_id: str) -> dict[str, Any]:
        """Take a version and close the live box."""
        return dict(await self._json("POST", _Calls.ws(workspace_id, "/stop")))

    async def versions(self, workspace_id: str) -> list[dict[str, Any]]:
        """Every version, oldest first."""
        out = await self._json("GET", _Calls.ws(workspace_id, "/versions"))
        return list(out["versions"])

    async def prune_versions(self, workspace_id: str, keep: int) -> list[str]:
        """Delete all but the ``keep`` newest versions; the removed ids."""
        path = _Calls.ws(workspace_id, "/versions/prune")
        return list((await self._json("POST", path, json={"keep": keep}))["removed"])

    async def take_version(self, workspace_id: str) -> dict[str, Any]:
        """Take a version of the live box now."""
        return dict(await self._json("POST", _Calls.ws(workspace_id, "/versions")))

    async def live_fs(self, workspace_id: str, op: str, **arguments: Any) -> dict[str, Any]:
        """One operation of the live box's ``fs`` module (``op`` and its arguments)."""
        body = {"op": op, **arguments}
        return dict(await self._json("POST", _Calls.ws(workspace_id, "/live/fs"), json=body))

    async def handles(self, workspace_id: str) -> list[dict[str, Any]]:
        """Every handle of a workspace, as last recorded."""
        out = await self._json("GET", _Calls.ws(workspace_id, "/handles"))
        return list(out["handles"])

    async def read_file(
        self,
        workspace_id: str,
        path: str,
        *,
        source: str | None = None,
        version_id: str | None = None,
    ) -> bytes:
        """A file of the current (or a given) version."""
        params = _Calls.source(path, source, version_id)
        resp = await self._http.get(_Calls.ws(workspace_id, "/files/read"), params=params)
        return _check(resp).content

    async def ls(
        self,
        workspace_id: str,
        path: str = "/",
        *,
        source: str | None = None,
        version_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """A directory of the current (or a given) version."""
        params = _Calls.source(path, source, version_id)
        out = await self._json("GET", _Calls.ws(workspace_id, "/files/ls"), params=params)
        return list(out["entries"])

    async def stat(
        self,
        workspace_id: str,
        path: str,
        *,
        source: str | None = None,
        version_id: str | None = None,
    ) -> dict[str, Any]:
        """A path's metadata in the current (or a given) version."""
        params = _Calls.source(path, source, version_id)
        return dict(await self._json("GET", _Calls.ws(workspace_id, "/files/stat"), params=params))

    async def exec(self, workspace_id: str, command: str, **options: Any) -> dict[str, Any]:
        """Start a command (``cwd``, ``env``, ``timeout_s``, ``retained_bytes``); its handle."""
        body = {"command": command, **options}
        return dict(await self._json("POST", _Calls.ws(workspace_id, "/exec"), json=body))

    async def pty(self, workspace_id: str, **options: Any) -> dict[str, Any]:
        """Start a terminal (``command``, ``cols``, ``rows``, ``cwd``, ``env``); its handle."""
        return dict(await self._json("POST", _Calls.ws(workspace_id, "/pty"), json=options))

    async def handle(self, workspace_id: str, handle_id: str) -> dict[str, Any]:
        """A handle's current info."""
        return dict(await self._json("GET", _Calls.ws(workspace_id, f"/handles/{handle_id}")))

    async def read(
        self,
        workspace_id: str,
        handle_id: str,
        *,
        stream: str = "stdout",
        cursor: int = 0,
        max_bytes: int = 65536,
        wait_s: float = 0.0,
    ) -> tuple[bytes, int, bool]:
        """``(data, next_cursor, ended)`` of a stream after ``cursor``."""
        params = {"stream": stream, "cursor": cursor, "max_bytes": max_bytes, "wait_s": wait_s}
        out = await self._json(
            "GET",
            _Calls.ws(workspace_id, f"/handles/{handle_id}/read"),
            params=params,
            timeout=wait_s + 30.0,
        )
        return base64.b64decode(out["data"]), int(out["next_cursor"]), bool(out["ended"])

    async def write_stdin(
        self, workspace_id: str, handle_id: str, data: bytes = b"", *, close: bool = False
    ) -> dict[str, Any]:
        """Send bytes to the process's stdin (or terminal); ``close`` sends EOF after."""
        body: dict[str, Any] = {"close": close}
        if data:  # the API refuses an empty ``data``: closing alone sends none
            body["data"] = base64.b64encode(data).decode("ascii")
        path = _Calls.ws(workspace_id, f"/handles/{handle_id}/stdin")
        return dict(await self._json("POST", path, json=body))

    async def signal(self, workspace_id: str, handle_id: str, signal: int) -> dict[str, Any]:
        """Send a signal to the process group."""
        path = _Calls.ws(workspace_id, f"/handles/{handle_id}/signal")
        return dict(await self._json("POST", path, json={"signal": signal}))

    async def resize(
        self, workspace_id: str, handle_id: str, cols: int, rows: int
    ) -> dict[str, Any]:
        """Resize a PTY handle's terminal."""
        path = _Calls.ws(workspace_id, f"/handles/{handle_id}/resize")
        return dict(await self._json("POST", path, json={"cols": cols, "rows": rows}))

    async def wait(
        self, workspace_id: str, handle_id: str, timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """Wait up to ``timeout_s`` for the process to end; its info either way."""
        path = _Calls.ws(workspace_id, f"/handles/{handle_id}/wait")
        return dict(
            await self._json("POST", path, json={"timeout_s": timeout_s}, timeout=timeout_s + 30)
        )

    async def kill(self, workspace_id: str, handle_id: str) -> dict[str, Any]:
        """Kill the process tree."""
        return dict(await self._json("POST", _Calls.ws(workspace_id, f"/handles/{handle_id}/kill")))

    async def follow(
        self,
        workspace_id: str,
        handle_id: str,
        *,
        stream: str = "stdout",
        cursor: int = 0,
        reconnects: int = 5,
    ) -> AsyncIterator[StreamEvent]:
        """Follow a stream over server-sent events until it ends, resuming after drops."""
        path = _Calls.ws(workspace_id, f"/handles/{handle_id}/events")
        left = reconnects
        while True:
            headers = {"last-event-id": str(cursor)}
            try:
                async with self._http.stream(
                    "GET", path, params={"stream": stream}, headers=headers, timeout=None
                ) as resp:
                    if resp.status_code >= 400:
                        await resp.aread()
                        _check(resp)
                    # The server ends the response after an ``end`` or ``error``
                    # event: reading on to that end lets httpx's generators finish.
                    final: StreamEvent | None = None
                    lines = cast(AsyncGenerator[str, None], resp.aiter_lines())
                    async with contextlib.aclosing(_parse_sse(lines)) as events:
                        async for event in events:
                            if final is not None:
                                continue
                            if event.kind in ("end", "error"):
                                final = event
                                continue
                            cursor = event.cursor
                            yield event
                    if final is not None:
                        if final.kind == "error":
                            err = json.loads(final.data)
                            raise ApiError(200, str(err.pop("code")), str(err.pop("message")), err)
                        yield final
                        return
            except (httpx.TransportError, httpx.RemoteProtocolError):
                if left <= 0:
                    raise
                left -= 1


async def _parse_sse(lines: AsyncGenerator[str, None]) -> AsyncGenerator[StreamEvent, None]:
    kind, data, cursor = "message", "", 0
    async with contextlib.aclosing(lines):
        async for line in lines:
            if not line:
                if data or kind != "message":
                    yield _event(kind, data, cursor)
                kind, data = "message", ""
            elif line.startswith(":"):
                continue
            else:
                field, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if field == "event":
                    kind = value
                elif field == "data":
                    data = value
                elif field == "id" and value.isdigit():
                    cursor = int(value)


def _event(kind: str, data: str, cursor: int) -> StreamEvent:
    if kind == "data":
        return StreamEvent("data", base64.b64decode(data), cursor, {})
    if kind == "end":
        return StreamEvent("end", b"", cursor, json.loads(data))
    # errors carry their JSON in ``data`` (bytes of it; parsed by the caller)
    return StreamEvent(kind, data.encode(), cursor, {})


class Client:
    """The blocking client: the same calls as :class:`AsyncClient`, returning directly.

    Args:
        base_url: ``http://127.0.0.1:8420`` (or ``https://...``).
        token: The project's bearer token.
        timeout_s: Per-request timeout.
        verify: TLS verification.
    """

    def __init__(
        self, base_url: str, token: str, *, timeout_s: float = 60.0, verify: bool | str = True
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url,
            headers={"authorization": f"Bearer {token}"},
            timeout=timeout_s,
            verify=verify,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def request(self, method: str, path: str, **kw: Any) -> Any:
        """Any API call: JSON answer (or bytes for a file read)."""
        resp = _check(self._http.request(method, path, **kw))
        if resp.headers.get("content-type", "").startswith("application/json"):
            return resp.json()
        return resp.content

    def create(
        self,
        sandbox: Mapping[str, Any],
        *,
        metadata: Mapping[str, Any] | None = None,
        tags: list[str] | None = None,
    ) -> dict[str, Any]:
        """See :meth:`AsyncClient.create`."""
        body = {"sandbox": dict(sandbox), "metadata": dict(metadata or {}), "tags": tags or []}
        return dict(self.request("POST", "/v1/workspaces", json=body))

    def get(self, workspace_id: str) -> dict[str, Any]:
        """See :meth:`AsyncClient.get`."""
        return dict(self.request("GET", _Calls.ws(workspace_id)))

    def list_workspaces(self, **params: Any) -> dict[str, Any]:
        """See :meth:`AsyncClient.list_workspaces` (``tag``, ``state``, ``cursor``, ``limit``)."""
        clean = {k: v for k, v in params.items() if v is not None}
        return dict(self.request("GET", "/v1/workspaces", params=clean))

    def update(self, workspace_id: str, **body: Any) -> dict[str, Any]:
        """See :meth:`AsyncClient.update` (``metadata``, ``tags``)."""
        clean = {k: v for k, v in body.items() if v is not None}
        return dict(self.request("PATCH", _Calls.ws(workspace_id), json=clean))

    def archive(self, workspace_id: str) -> dict[str, Any]:
        """See :meth:`AsyncClient.archive`."""
        return dict(self.request("POST", _Calls.ws(workspace_id, "/archive")))

    def delete(self, workspace_id: str) -> None:
        """See :meth:`AsyncClient.delete`."""
        self.request("DELETE", _Calls.ws(workspace_id))

    def connect(self, workspace_id: str) -> dict[str, Any]:
        """See :meth:`AsyncClient.connect`."""
        return dict(self.request("POST", _Calls.ws(workspace_id, "/connect")))

    def prune_versions(self, workspace_id: str, keep: int) -> list[str]:
        """Delete all but the ``keep`` newest versions; the removed ids."""
        path = _Calls.ws(workspace_id, "/versions/prune")
        return list(self.request("POST", path, json={"keep": keep})["removed"])

    def stop(self, workspace_id: str) -> dict[str, Any]:
        """See :meth:`AsyncClient.stop`."""
        return dict(self.request("POST", _Calls.ws(workspace_id, "/stop")))

    def read_file(
        self,
        workspace_id: str,
        path: str,
        *,
        source: str | None = None,
        version_id: str | None = None,
    ) -> bytes:
        """See :meth:`AsyncClient.read_file`."""
        params = _Calls.source(path, source, version_id)
        return bytes(self.request("GET", _Calls.ws(workspace_id, "/files/read"), params=params))

    def ls(
        self,
        workspace_id: str,
        path: str = "/",
        *,
        source: str | None = None,
        version_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """See :meth:`AsyncClient.ls`."""
        params = _Calls.source(path, source, version_id)
        return list(
            self.request("GET", _Calls.ws(workspace_id, "/files/ls"), params=params)["entries"]
        )

    def stat(
        self,
        workspace_id: str,
        path: str,
        *,
        source: str | None = None,
        version_id: str | None = None,
    ) -> dict[str, Any]:
        """See :meth:`AsyncClient.stat`."""
        params = _Calls.source(path, source, version_id)
        return dict(self.request("GET", _Calls.ws(workspace_id, "/files/stat"), params=params))

    def exec(self, workspace_id: str, command: str, **options: Any) -> dict[str, Any]:
        """See :meth:`AsyncClient.exec`."""
        body = {"command": command, **options}
        return dict(self.request("POST", _Calls.ws(workspace_id, "/exec"), json=body))

    def read(
        self,
        workspace_id: str,
        handle_id: str,
        *,
        stream: str = "stdout",
        cursor: int = 0,
        max_bytes: int = 65536,
        wait_s: float = 0.0,
    ) -> tuple[bytes, int, bool]:
        """See :meth:`AsyncClient.read`."""
        params = {"stream": stream, "cursor": cursor, "max_bytes": max_bytes, "wait_s": wait_s}
        out = self.request(
            "GET",
            _Calls.ws(workspace_id, f"/handles/{handle_id}/read"),
            params=params,
            timeout=wait_s + 30.0,
        )
        return base64.b64decode(out["data"]), int(out["next_cursor"]), bool(out["ended"])

    def wait(self, workspace_id: str, handle_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """See :meth:`AsyncClient.wait`."""
        path = _Calls.ws(workspace_id, f"/handles/{handle_id}/wait")
        return dict(
            self.request("POST", path, json={"timeout_s": timeout_s}, timeout=timeout_s + 30)
        )

    def output(
        self, workspace_id: str, handle_id: str, *, stream: str = "stdout"
    ) -> Iterator[bytes]:
        """Every byte of a stream until it ends (long-polling reads)."""
        cursor = 0
        while True:
            data, cursor, ended = self.read(
                workspace_id, handle_id, stream=stream, cursor=cursor, wait_s=10.0
            )
            if data:
                yield data
            if ended:
                return
