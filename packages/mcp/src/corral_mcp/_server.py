"""Build an MCP server (the SDK's low-level ``Server``) over a workspace session.

The low-level server is used rather than ``MCPServer``/``FastMCP`` because the
tools already carry their own JSON Schemas and validation: the decorator API
would derive schemas from Python signatures and validate a second time.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Mapping
from typing import Any, Final

from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

from corral import Tool, ToolResult, WorkspaceSession

from ._address import DEFAULT_SERVER_NAME

__all__ = ["build_server", "to_call_result", "to_mcp_tool"]

log = logging.getLogger("corral.mcp")


_INSTRUCTIONS: Final = (
    "Tools of a corral workspace: files, and a shell when the provider has one. "
    "Paths are relative to the workspace root; nothing outside it is reachable."
)


def _version() -> str:
    try:
        return importlib.metadata.version("corral-mcp")
    except importlib.metadata.PackageNotFoundError:
        return ""


def to_mcp_tool(tool: Tool) -> types.Tool:
    """The MCP description of a corral tool: name, description, argument schema, and,
    where the tool declares them, its annotations (read-only, destructive,
    idempotent, open-world hints) and the schema of its structured result.

    A host may use the hints to decide what to confirm with the user; the
    client validates ``structuredContent`` against the output schema.
    """
    hints = tool.hints
    annotations = (
        types.ToolAnnotations(
            read_only_hint=hints.read_only,
            destructive_hint=hints.destructive,
            idempotent_hint=hints.idempotent,
            open_world_hint=hints.open_world,
        )
        if hints is not None
        else None
    )
    output = tool.output_schema
    return types.Tool(
        name=tool.name,
        description=tool.description,
        input_schema=_plain(tool.parameters),
        output_schema=_plain(output) if output is not None else None,
        annotations=annotations,
    )


def to_call_result(result: ToolResult) -> types.CallToolResult:
    """An MCP tool result: the text content and images, plus ``data`` as structured content.

    MCP's ``structuredContent`` must be a JSON object, so a result whose data
    is a list or a scalar travels as ``{"result": data}``. Errors carry only the
    clean message (``isError=true``); their ``error_code`` rides in ``_meta``
    so a client can branch on it without parsing the text.
    """
    content: list[types.ContentBlock] = [types.TextContent(type="text", text=result.content)]
    content += [
        types.ImageContent(type="image", data=image.data, mime_type=image.mime_type)
        for image in result.images
    ]
    if result.is_error:
        meta = {"corral/error_code": result.error_code} if result.error_code else None
        return types.CallToolResult(content=content, is_error=True, _meta=meta)
    structured: Any = None
    if isinstance(result.data, Mapping):
        structured = _plain(result.data)
    elif result.data is not None:
        structured = {"result": result.data}
    return types.CallToolResult(content=content, structured_content=structured, is_error=False)


def _plain(mapping: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in mapping.items()}


def build_server(
    session: WorkspaceSession,
    *,
    name: str = DEFAULT_SERVER_NAME,
    instructions: str | None = _INSTRUCTIONS,
) -> Server[Any]:
    """An MCP server exposing ``session``'s tools, for any MCP transport.

    Run it with :func:`corral_mcp.serve_stdio` / :func:`corral_mcp.serve_http`,
    or hand it to your own transport (``await server.run(read, write,
    server.create_initialization_options())``). The server never owns the
    session: closing the workspace stays with whoever opened it.

    A failed tool call is an MCP tool error (``isError=true``) with the tool's
    clean message; an unknown tool name too. Cancelling the request (the
    client's ``notifications/cancelled``, or its disconnect) cancels the tool
    call itself, so a running command's process tree is killed by its shell.

    Args:
        session: The workspace session whose tools are served.
        name: The server name announced to clients.
        instructions: Text the client may show the model (None for none).
    """
    tools = session.tools
    listing = types.ListToolsResult(tools=[to_mcp_tool(t) for t in tools])

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return listing

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            result = await session.call(params.name, params.arguments or {})
        except Exception:
            # The toolset already turns failures into results; this is the last
            # line so that a bug below can never take the connection down.
            log.exception("tool %s raised unexpectedly", params.name)
            result = ToolResult(
                f"{params.name} failed with an internal error; the operator has the details",
                is_error=True,
                error_code="internal",
            )
        return to_call_result(result)

    def input_schema(tool_name: str) -> Mapping[str, Any] | None:
        for tool in tools:
            if tool.name == tool_name:
                return tool.parameters
        return None

    return Server(
        name,
        version=_version(),
        instructions=instructions,
        get_tool_input_schema=input_schema,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
