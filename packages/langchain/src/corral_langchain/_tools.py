"""corral's workspace tools as LangChain ``StructuredTool`` objects."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.tools import StructuredTool, ToolException

import corral
from corral import AsyncCall, ToolSource, bound_tools
from corral.sync import SyncWorkspaceSession

__all__ = ["workspace_tools"]

Output = tuple[str, Any]
"""``(content for the model, structured data)``: LangChain's content_and_artifact form."""


def _output(result: corral.ToolResult) -> Output:
    if result.is_error:
        # Handled by LangChain (handle_tool_error=True): a ToolMessage with
        # status="error". The prefix keeps the failure visible to models whose
        # API has no error flag (OpenAI), as corral's own bridges do.
        raise ToolException(f"error: {result.content}")
    return result.content, result.data


def _coroutine(call: AsyncCall) -> Callable[..., Awaitable[Output]]:
    async def run(**arguments: Any) -> Output:
        return _output(await call(arguments))

    return run


def _blocking(tool: corral.Tool, session: SyncWorkspaceSession) -> Callable[..., Output]:
    def run(**arguments: Any) -> Output:
        # Thread-safe: the call is handed to the session's own loop.
        return _output(session.portal.call(functools.partial(tool, arguments, strict=True)))

    return run


def workspace_tools(source: ToolSource) -> list[StructuredTool]:
    """The workspace's tools as LangChain tools, ready for ``model.bind_tools(...)``.

    Each tool's ``args_schema`` is corral's JSON Schema; corral validates the
    arguments before any I/O. A call returns a ``ToolMessage`` whose content
    is the text corral renders for the model and whose ``artifact`` is the
    structured result; a failed call gives ``status="error"`` and content
    starting with ``error:`` (never an exception, so the loop goes on).

    Async invocation (``ainvoke``) works for every source. Sync invocation
    (``invoke``) needs a ``corral.sync`` session: an async session's
    workspace belongs to its event loop, which a blocking call cannot wait on
    without stalling it, so LangChain then refuses sync invocation.

    Args:
        source: An open ``corral.WorkspaceSession`` or ``WorkspaceToolset``
            (async only, on its own event loop), a ``corral.sync`` session
            (sync, and async from any loop through a worker thread), or
            ``corral.Tool`` objects.

    Raises:
        TypeError: ``source`` is none of the above.
    """
    out = []
    for tool, call in bound_tools(source):
        func = _blocking(tool, source) if isinstance(source, SyncWorkspaceSession) else None
        out.append(
            StructuredTool(
                name=tool.name,
                description=tool.description,
                args_schema=dict(tool.parameters),
                func=func,
                coroutine=_coroutine(call),
                response_format="content_and_artifact",
                handle_tool_error=True,
            )
        )
    return out
