"""corral workspaces as LangChain tools.

``workspace_tools(ws)`` turns an open workspace session's tools into
LangChain ``StructuredTool`` objects::

    import corral
    from corral_langchain import workspace_tools

    async with corral.open_workspace("local-sandbox", {"fs": True, "shell": True}) as ws:
        tools = workspace_tools(ws)
        model = chat_model.bind_tools(tools)
        ...  # tool calls: await tools_by_name[call["name"]].ainvoke(call) -> ToolMessage
"""

from __future__ import annotations

from corral import ToolSource

from ._tools import workspace_tools

__all__ = ["ToolSource", "workspace_tools"]
