"""Running the API: hypercorn on whichever event loop is running (trio or asyncio).

hypercorn, not corral-mcp's small h11 server: the service needs TLS for
``--allow-remote``, many concurrent long-lived event streams and a
graceful shutdown, all of which hypercorn has (and it runs on trio and
asyncio alike, which uvicorn does not). The listening socket is bound here
(so ``port=0`` reports the port it got) and handed to hypercorn by fd.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
from typing import Any

import anyio
import anyio.abc

from ._app import ApiApp
from ._errors import ServiceError
from ._service import WorkspaceService

__all__ = ["check_bind", "serve"]

log = logging.getLogger("corral.server")


def check_bind(host: str, *, allow_remote: bool, certfile: str | None, keyfile: str | None) -> None:
    """Refuse a non-loopback bind unless ``allow_remote`` with TLS settings.

    Raises:
        ServiceError: ``host`` is not an IP address, or is not loopback
            without ``allow_remote``, or ``allow_remote`` lacks cert/key files.
    """
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ServiceError("the bind host must be an IP address") from None
    if address.is_loopback:
        return
    if not allow_remote:
        raise ServiceError("binding a non-loopback address needs --allow-remote (and TLS)")
    if not certfile or not keyfile:
        raise ServiceError("--allow-remote requires --tls-cert and --tls-key")
    for path in (certfile, keyfile):
        if not os.path.isfile(path):
            raise ServiceError("a TLS file does not exist")


async def serve(
    service: WorkspaceService,
    host: str = "127.0.0.1",
    port: int = 8420,
    *,
    allow_remote: bool = False,
    certfile: str | None = None,
    keyfile: str | None = None,
    max_body_bytes: int = 1 << 20,
    keepalive_s: float = 15.0,
    task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API until cancelled; report the bound ``(host, port)`` through ``task_status``.

    Raises:
        ServiceError: A refused bind (see :func:`check_bind`).
    """
    from hypercorn.config import Config

    check_bind(host, allow_remote=allow_remote, certfile=certfile, keyfile=keyfile)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    bound = sock.getsockname()
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("corral.server.hypercorn")
    config.keep_alive_timeout = 75
    config.graceful_timeout = 2.0
    if certfile and keyfile:
        config.certfile, config.keyfile = certfile, keyfile
    app = ApiApp(service, max_body_bytes=max_body_bytes, keepalive_s=keepalive_s)
    shutdown = anyio.Event()
    done = anyio.Event()

    async def run_server() -> None:
        # Shielded: the server is stopped by its shutdown trigger (graceful:
        # open event streams end, connections close), never torn by a cancel.
        with anyio.CancelScope(shield=True):
            try:
                await _run(app, config, shutdown)
            finally:
                done.set()

    try:
        async with anyio.create_task_group() as tg:
            await service.start(tg)
            tg.start_soon(run_server)
            task_status.started((str(bound[0]), int(bound[1])))
            try:
                await done.wait()
            finally:
                shutdown.set()
                with anyio.move_on_after(10, shield=True):
                    await done.wait()
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await service.aclose()
        # hypercorn adopted the listening fd and closed it.
        sock.detach()


def _on_trio() -> bool:
    """Whether the running event loop is trio's (anyio names no public way to ask)."""
    trio = sys.modules.get("trio")
    if trio is None:
        return False
    try:
        trio.lowlevel.current_root_task()
    except RuntimeError:
        return False
    return True


async def _run(app: ApiApp, config: Any, shutdown: anyio.Event) -> None:
    if _on_trio():
        from hypercorn.trio import serve as trio_serve

        await trio_serve(app, config, shutdown_trigger=shutdown.wait)  # type: ignore[arg-type]
    else:
        from hypercorn.asyncio import serve as asyncio_serve

        await asyncio_serve(app, config, shutdown_trigger=shutdown.wait)  # type: ignore[arg-type]
