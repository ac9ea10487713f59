"""corral's workspace tools as OpenAI Agents SDK ``FunctionTool`` objects."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from agents import FunctionTool
from agents import Tool as AgentTool
from agents.tool_context import ToolContext

from corral import AsyncCall, Tool, ToolResult, ToolSource, bound_tools

__all__ = ["workspace_tools"]


def _text(result: ToolResult) -> str:
    # The SDK has no error flag on a tool's output: the prefix is how the
    # model tells a failure from a result (as corral's own bridges do).
    return f"error: {result.content}" if result.is_error else result.content


def _invoker(call: AsyncCall) -> Callable[[ToolContext[Any], str], Awaitable[str]]:
    async def on_invoke_tool(_context: ToolContext[Any], raw_arguments: str) -> str:
        try:
            arguments = json.loads(raw_arguments) if raw_arguments.strip() else {}
        except ValueError:
            # Never echo what the model sent: it may be huge or hostile.
            return "error: tool arguments are not valid JSON"
        return _text(await call(arguments))

    return on_invoke_tool


def _function_tool(tool: Tool, call: AsyncCall, *, strict: bool) -> FunctionTool:
    schema = tool.strict_parameters if strict else tool.parameters
    return FunctionTool(
        name=tool.name,
        description=tool.description,
        # A private deep copy: the SDK rewrites the schema it is given.
        params_json_schema=json.loads(json.dumps(schema)),
        on_invoke_tool=_invoker(call),
        strict_json_schema=strict,
    )


def workspace_tools(source: ToolSource, *, strict: bool = True) -> list[AgentTool]:
    """The workspace's tools, ready for ``Agent(tools=...)``.

    Every item is a ``FunctionTool``; the list is typed as the SDK's ``Tool``
    union because ``Agent(tools=)`` takes a (invariant) ``list`` of that
    union, which a ``list[FunctionTool]`` does not satisfy under mypy.

    Each tool validates its arguments in corral (before any I/O) and runs on
    the session; a failed call is returned to the model as text starting
    with ``error:`` rather than raised, so one bad call never ends the run.

    Args:
        source: An open ``corral.WorkspaceSession`` or ``WorkspaceToolset``
            (used on the agent's own event loop), a ``corral.sync`` session
            (any loop; each call waits in a worker thread), or ``corral.Tool``
            objects.
        strict: Give the SDK each tool's strict-mode schema (every argument
            required, optional ones nullable, maps as name/value lists), as
            its default strict mode requires. ``False`` gives the ordinary
            schema with the SDK's strict mode off.

    Raises:
        TypeError: ``source`` is none of the above.
        agents.exceptions.UserError: The SDK refused a schema (a third-party
            capability whose schema strict mode cannot express; pass
            ``strict=False``).
    """
    tools: list[AgentTool] = [
        _function_tool(tool, call, strict=strict) for tool, call in bound_tools(source)
    ]
    return tools
