"""corral workspaces for pydantic-ai agents.

``workspace_toolset(ws)`` turns an open workspace session's tools into a
pydantic-ai toolset (``workspace_tools(ws)`` into a list of ``Tool``)::

    from pydantic_ai import Agent
    import corral
    from corral_pydantic_ai import workspace_toolset

    agent = Agent("openai:gpt-5")
    async with corral.open_workspace("local-sandbox", {"fs": True, "shell": True}) as ws:
        result = await agent.run("write hello.py and run it", toolsets=[workspace_toolset(ws)])
"""

from __future__ import annotations

from corral import ToolSource

from ._tools import RETRY_CODES, workspace_tools, workspace_toolset

__all__ = ["RETRY_CODES", "ToolSource", "workspace_tools", "workspace_toolset"]
