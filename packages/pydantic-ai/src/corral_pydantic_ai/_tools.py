"""corral's workspace tools as pydantic-ai tools and a toolset."""

from __future__ import annotations

from typing import Any

from pydantic_ai import FunctionToolset, ModelRetry, Tool, ToolFailed

import corral
from corral import AsyncCall, ToolSource, bound_tools

__all__ = ["RETRY_CODES", "workspace_tools", "workspace_toolset"]

RETRY_CODES = frozenset({"invalid_argument", "invalid_path"})
"""Error codes that mean "the model sent bad arguments": these ask it to retry."""


def _function(call: AsyncCall) -> Any:
    async def run(**arguments: Any) -> str:
        result = await call(arguments)
        if not result.is_error:
            return result.content
        # Bad arguments are what pydantic-ai's own validation answers with a
        # retry prompt; anything else (not found, too large, a failed
        # workspace) is a terminal result the model should adapt to, and must
        # not spend the tool's retry budget (exhausting it ends the run).
        if result.error_code in RETRY_CODES:
            raise ModelRetry(result.content)
        raise ToolFailed(result.content)

    return run


def _tool(tool: corral.Tool, call: AsyncCall) -> Tool[Any]:
    return Tool.from_schema(
        _function(call),
        name=tool.name,
        description=tool.description,
        json_schema=dict(tool.parameters),
    )


def workspace_tools(source: ToolSource) -> list[Tool[Any]]:
    """The workspace's tools as pydantic-ai ``Tool`` objects (for ``Agent(tools=...)``).

    Arguments are validated by corral (before any I/O), not by pydantic-ai;
    a successful call returns the text corral renders for the model. Bad
    arguments (``invalid_argument``, ``invalid_path``) raise ``ModelRetry``;
    every other failure raises ``ToolFailed``, so the model sees it without
    spending retries.

    Args:
        source: An open ``corral.WorkspaceSession`` or ``WorkspaceToolset``
            (used on the agent's own event loop), a ``corral.sync`` session
            (any loop, e.g. under ``agent.run_sync``; each call waits in a
            worker thread), or ``corral.Tool`` objects.

    Raises:
        TypeError: ``source`` is none of the above.
    """
    return [_tool(tool, call) for tool, call in bound_tools(source)]


def workspace_toolset(
    source: ToolSource, *, id: str | None = None, max_retries: int | None = None
) -> FunctionToolset[Any]:
    """The workspace's tools as one pydantic-ai toolset (for ``Agent(toolsets=[...])``).

    A toolset is pydantic-ai's unit of composition: it can be prefixed,
    filtered, put behind approval, or passed per run
    (``agent.run(..., toolsets=[...])``) for a workspace opened per request.

    Args:
        source: As :func:`workspace_tools`.
        id: The toolset's id (needed by durable execution engines).
        max_retries: Retries per tool after ``ModelRetry``; None inherits the
            agent's.

    Raises:
        TypeError: ``source`` is none of the above.
    """
    return FunctionToolset(workspace_tools(source), id=id, max_retries=max_retries)
