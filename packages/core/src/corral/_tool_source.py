"""Where a framework adapter's tools come from, and how to call one on the loop that owns it.

Framework adapters (corral-langchain, corral-pydantic-ai, corral-openai-agents,
and anyone writing another) accept a session in any of its forms and must
call each tool on the event loop that owns the session: an async session is
called directly, a :mod:`corral.sync` session through its portal from a worker
thread, so the framework's own loop never blocks. One implementation here
keeps that rule in one place.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable

import anyio.to_thread

from ._session import WorkspaceSession
from ._tool import Tool, ToolResult
from ._toolset import WorkspaceToolset
from .sync import SyncWorkspaceSession

__all__ = ["AsyncCall", "ToolSource", "bound_tools"]

ToolSource = WorkspaceSession | WorkspaceToolset | SyncWorkspaceSession | Iterable[Tool]
"""What the adapter accepts: an async session or toolset, a ``corral.sync`` session, or tools."""

AsyncCall = Callable[[object], Awaitable[ToolResult]]
"""Runs one tool with the model's decoded arguments; never raises for a failed call."""


def _on_own_loop(tool: Tool) -> AsyncCall:
    async def call(arguments: object) -> ToolResult:
        # strict=True: the strict-mode argument form is a superset of the
        # ordinary one, so whichever schema the model saw is understood.
        return await tool(arguments, strict=True)

    return call


def _through_portal(tool: Tool, session: SyncWorkspaceSession) -> AsyncCall:
    portal = session.portal

    async def call(arguments: object) -> ToolResult:
        # The session lives on its portal's loop, not the framework's: a worker
        # thread waits for the portal so this loop never blocks.
        run = functools.partial(tool, arguments, strict=True)
        return await anyio.to_thread.run_sync(portal.call, run)

    return call


def bound_tools(source: ToolSource) -> list[tuple[Tool, AsyncCall]]:
    """Each tool of ``source`` with the coroutine function that calls it correctly.

    A session's ``raise_on_error`` is deliberately bypassed: the model always
    gets a result.
    """
    if isinstance(source, SyncWorkspaceSession):
        return [(tool, _through_portal(tool, source)) for tool in source.tools]
    tools = source.tools if isinstance(source, WorkspaceSession | WorkspaceToolset) else source
    out: list[tuple[Tool, AsyncCall]] = []
    for tool in tools:
        if not isinstance(tool, Tool):
            raise TypeError(
                "expected a corral WorkspaceSession, WorkspaceToolset, corral.sync session "
                f"or corral.Tool objects, got a {type(tool).__name__}"
            )
        out.append((tool, _on_own_loop(tool)))
    return out
