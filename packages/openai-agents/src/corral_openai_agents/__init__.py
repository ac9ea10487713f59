"""corral workspaces for the OpenAI Agents SDK.

``workspace_tools(ws)`` turns an open workspace session's tools into the
SDK's ``FunctionTool`` objects with strict-mode schemas::

    from agents import Agent, Runner
    import corral
    from corral_openai_agents import workspace_tools

    async with corral.open_workspace("local-sandbox", {"fs": True, "shell": True}) as ws:
        agent = Agent(name="coder", tools=workspace_tools(ws))
        result = await Runner.run(agent, "write hello.py and run it")
"""

from __future__ import annotations

from corral import ToolSource

from ._tools import workspace_tools

__all__ = ["ToolSource", "workspace_tools"]
