"""corral-mcp: serve a corral workspace's tools over the Model Context Protocol.

The ``corral mcp`` command serves a session over stdio (what MCP hosts launch)
or streamable HTTP; the library API embeds the same server elsewhere::

    async with corral.open_workspace("local-bash") as ws:
        await corral_mcp.serve_stdio(ws)

The MCP SDK is imported on first use of a name that needs it, so the
``corral`` CLI's plugin loading stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.capability import lazy_exports

from ._address import (
    DEFAULT_HTTP_PATH,
    DEFAULT_SERVER_NAME,
    check_bind_host,
    parse_http_address,
)
from ._command import MCP_COMMAND

if TYPE_CHECKING:
    from ._serve import serve_http, serve_stdio
    from ._server import build_server, to_call_result, to_mcp_tool

__all__ = [
    "DEFAULT_HTTP_PATH",
    "DEFAULT_SERVER_NAME",
    "MCP_COMMAND",
    "build_server",
    "check_bind_host",
    "parse_http_address",
    "serve_http",
    "serve_stdio",
    "to_call_result",
    "to_mcp_tool",
]

_LAZY = {
    "serve_http": "._serve",
    "serve_stdio": "._serve",
    "build_server": "._server",
    "to_call_result": "._server",
    "to_mcp_tool": "._server",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
