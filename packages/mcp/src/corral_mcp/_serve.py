"""Serving a workspace session over stdio or streamable HTTP."""

from __future__ import annotations

import ipaddress

import anyio
import anyio.abc
from mcp.server.transport_security import TransportSecuritySettings

from corral import WorkspaceSession

from ._address import DEFAULT_HTTP_PATH, DEFAULT_SERVER_NAME, check_bind_host
from ._asgi import serve_asgi
from ._server import build_server
from ._stdio import stdio_streams

__all__ = ["serve_http", "serve_stdio"]


async def serve_stdio(session: WorkspaceSession, *, name: str = DEFAULT_SERVER_NAME) -> None:
    """Serve ``session``'s tools over this process's stdin/stdout.

    Returns when the client closes stdin; cancel the calling scope to stop
    earlier. In-flight tool calls are cancelled either way (a running
    command's process tree is killed). While serving, stdout is reserved for
    the protocol: fd 1 points at stderr, so stray output cannot corrupt it.
    The session is not closed: that stays with whoever opened it.

    Args:
        session: The workspace session to serve.
        name: The server name announced to clients.
    """
    server = build_server(session, name=name)
    async with stdio_streams() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def _loopback_security(host: str) -> TransportSecuritySettings | None:
    """DNS-rebinding protection (Host and Origin checks) for a loopback bind."""
    if not ipaddress.ip_address(host).is_loopback:
        return None
    shown = f"[{host}]" if ":" in host else host
    hosts = {"127.0.0.1", "localhost", "[::1]", shown}
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=sorted(f"{h}:*" for h in hosts),
        allowed_origins=sorted(f"http://{h}:*" for h in hosts),
    )


async def serve_http(
    session: WorkspaceSession,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    path: str = DEFAULT_HTTP_PATH,
    allow_remote: bool = False,
    name: str = DEFAULT_SERVER_NAME,
    task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``session``'s tools over streamable HTTP at ``http://host:port/path``.

    Runs until cancelled; each MCP client gets its own protocol session, all
    sharing the one workspace. A loopback bind checks the Host and Origin
    headers against DNS rebinding. Use with ``task_group.start`` to learn the
    bound address (``port=0`` picks a free port).

    Args:
        session: The workspace session to serve.
        host: IP address to bind (loopback unless ``allow_remote``).
        port: TCP port (0 for any free port).
        path: The endpoint path.
        allow_remote: Permit a non-loopback address. There is no
            authentication: whoever reaches the port controls the workspace.
        name: The server name announced to clients.
        task_status: Receives the bound ``(host, port)`` once accepting.

    Raises:
        ConfigError: A non-loopback ``host`` without ``allow_remote``, or not an IP.
        OSError: The address cannot be bound.
    """
    address = check_bind_host(host, allow_remote=allow_remote)
    server = build_server(session, name=name)
    app = server.streamable_http_app(
        streamable_http_path=path,
        host=address,
        transport_security=_loopback_security(address),
    )
    async with server.session_manager.run():
        await serve_asgi(app, address, port, task_status=task_status)
