"""Bridges to plain agent loops: run a model's tool calls, return the API's result messages.

No SDK is imported: messages may be plain dicts or SDK objects (anything with
``model_dump()``), so the OpenAI and Anthropic clients both work as they are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ._tool import ToolResult

__all__ = ["ToolCaller", "anthropic_tool_results", "openai_tool_messages"]


class ToolCaller(Protocol):
    """Anything with ``call(name, arguments)``: a WorkspaceSession or WorkspaceToolset."""

    async def call(self, name: str, arguments: Any) -> ToolResult:
        """Call a tool."""
        ...


def _plain(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    return dump() if callable(dump) else obj


async def _run(tools: ToolCaller, name: Any, raw_arguments: Any) -> ToolResult:
    if not isinstance(name, str):
        return ToolResult("tool call has no name", is_error=True, error_code="invalid_argument")
    arguments = raw_arguments
    if isinstance(raw_arguments, str):
        try:
            arguments = json.loads(raw_arguments) if raw_arguments.strip() else {}
        except ValueError:
            return ToolResult(
                "tool arguments are not valid JSON", is_error=True, error_code="invalid_argument"
            )
    return await tools.call(name, arguments)


async def openai_tool_messages(tools: ToolCaller, assistant_message: Any) -> list[dict[str, Any]]:
    """Execute the ``tool_calls`` of an OpenAI Chat Completions assistant message.

    Returns one ``{"role": "tool", "tool_call_id": ..., "content": ...}``
    message per call, in order, ready to append to ``messages``. A failed
    call's content starts with ``error:`` so the model can tell.
    """
    message = _plain(assistant_message)
    calls: Sequence[Any] = (
        message.get("tool_calls") if isinstance(message, Mapping) else None
    ) or []
    out: list[dict[str, Any]] = []
    for raw in calls:
        call = _plain(raw)
        function = _plain(call.get("function", {}))
        result = await _run(tools, function.get("name"), function.get("arguments", "{}"))
        content = f"error: {result.content}" if result.is_error else result.content
        out.append({"role": "tool", "tool_call_id": call.get("id"), "content": content})
    return out


async def anthropic_tool_results(tools: ToolCaller, assistant_content: Any) -> dict[str, Any]:
    """Execute the ``tool_use`` blocks of an Anthropic Messages API response.

    Args:
        assistant_content: The response's ``content`` (a list of blocks), or the
            whole response / assistant message holding it.

    Returns:
        The user message to send back: ``{"role": "user", "content": [tool_result...]}``.
    """
    content = _plain(assistant_content)
    if isinstance(content, Mapping):
        content = content.get("content", [])
    blocks: list[dict[str, Any]] = []
    for raw in content or []:
        block = _plain(raw)
        if not isinstance(block, Mapping) or block.get("type") != "tool_use":
            continue
        result = await _run(tools, block.get("name"), block.get("input", {}))
        blocks.append(
            {
                "type": "tool_result",
                "tool_use_id": block.get("id"),
                "content": result.content,
                "is_error": result.is_error,
            }
        )
    return {"role": "user", "content": blocks}
