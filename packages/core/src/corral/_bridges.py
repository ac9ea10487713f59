"""Bridges to plain agent loops: tool specs in each API's format, and result messages.

No SDK is imported: messages may be plain dicts or SDK objects (anything with
``model_dump()``), so the OpenAI and Anthropic clients both work as they are.

The return types are ``TypedDict`` mirrors of the SDKs' own parameter types,
so that ``mypy --strict`` accepts ``tools=ws.openai_tools()`` and the result
messages where the SDK's typed parameters expect them. A TypedDict is only
assignable to another when it declares *every* key of it with an equivalent
type, so each mirror lists the SDK's keys (those corral never sets as
``NotRequired``) and types a value ``Any`` where the SDK's type is a nested
SDK class (its cache-control or citation objects) that core cannot name
without importing the SDK. ``packages/core/tests/test_sdk_typing.py`` proves
the mirrors against the SDK versions in the lock file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NotRequired, Protocol, Required, TypedDict

from ._tool import Tool, ToolResult

__all__ = [
    "AnthropicTool",
    "AnthropicToolResultBlock",
    "AnthropicToolResultMessage",
    "OpenAIAssistantMessage",
    "OpenAIFunction",
    "OpenAIResponsesFunctionCallOutput",
    "OpenAIResponsesTool",
    "OpenAITool",
    "OpenAIToolMessage",
    "ToolCaller",
    "anthropic_tool",
    "anthropic_tool_results",
    "openai_assistant_message",
    "openai_responses_tool",
    "openai_responses_tool_outputs",
    "openai_tool",
    "openai_tool_messages",
]


class ToolCaller(Protocol):
    """Anything with ``call(name, arguments, strict=...)``: a WorkspaceSession or toolset."""

    async def call(self, name: str, arguments: Any, *, strict: bool = False) -> ToolResult:
        """Call a tool; ``strict`` also accepts the strict-mode argument form."""
        ...


# -- the OpenAI Chat Completions API -------------------------------------------------


class OpenAIFunction(TypedDict, total=False):
    """``FunctionDefinition``: a function's name, description and argument schema."""

    name: Required[str]
    description: str
    parameters: dict[str, object]
    strict: bool | None


class OpenAITool(TypedDict, total=False):
    """``ChatCompletionFunctionToolParam``: one entry of ``tools=``."""

    type: Required[Literal["function"]]
    function: Required[OpenAIFunction]


class OpenAIToolMessage(TypedDict):
    """``ChatCompletionToolMessageParam``: a tool's answer, appended to ``messages``.

    ``content`` is always a string here; the union is the SDK's.
    """

    role: Literal["tool"]
    tool_call_id: str
    content: str | Iterable[Any]


class OpenAIAssistantMessage(TypedDict, total=False):
    """``ChatCompletionAssistantMessageParam``: the model's turn, as sent back to it."""

    role: Required[Literal["assistant"]]
    content: str | Iterable[Any] | None
    tool_calls: Iterable[Any]
    refusal: str | None
    name: str
    audio: Any
    function_call: Any


def openai_tool(tool: Tool, *, strict: bool = False) -> OpenAITool:
    """One tool as a Chat Completions function spec.

    Args:
        tool: The tool.
        strict: Use the strict-mode schema and set ``strict: true`` (the
            model then always sends every argument; dispatch with
            ``strict=True``, as the bridges here do).
    """
    function: OpenAIFunction = {
        "name": tool.name,
        "description": tool.description,
        "parameters": dict(tool.strict_parameters if strict else tool.parameters),
    }
    if strict:
        function["strict"] = True
    return {"type": "function", "function": function}


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
    from ._session import WorkspaceSession  # the session imports this module

    # A session's raise_on_error is for library calls: the model always gets
    # a result. The strict-mode form is a superset of the ordinary one, so
    # whichever schema the model was shown, its arguments are understood.
    caller = tools.toolset if isinstance(tools, WorkspaceSession) else tools
    return await caller.call(name, arguments, strict=True)


def _text(result: ToolResult) -> str:
    return f"error: {result.content}" if result.is_error else result.content


def _responses_output(result: ToolResult) -> str | list[Any]:
    """Text alone, or text then ``input_image`` parts when the result carries images."""
    if not result.images:
        return _text(result)
    parts: list[Any] = [{"type": "input_text", "text": _text(result)}]
    parts += [
        {"type": "input_image", "image_url": f"data:{image.mime_type};base64,{image.data}"}
        for image in result.images
    ]
    return parts


def _anthropic_content(result: ToolResult) -> str | list[Any]:
    """Text alone, or a text block then base64 ``image`` blocks when the result carries images."""
    if not result.images:
        return result.content
    blocks: list[Any] = [{"type": "text", "text": result.content}]
    blocks += [
        {
            "type": "image",
            "source": {"type": "base64", "media_type": image.mime_type, "data": image.data},
        }
        for image in result.images
    ]
    return blocks


async def openai_tool_messages(
    tools: ToolCaller, assistant_message: Any
) -> list[OpenAIToolMessage]:
    """Execute the ``tool_calls`` of an OpenAI Chat Completions assistant message.

    Returns one ``{"role": "tool", "tool_call_id": ..., "content": ...}``
    message per call, in order, ready to append to ``messages``. A failed
    call's content starts with ``error:`` so the model can tell. Chat
    Completions tool messages hold text only: a result's images
    (``ToolResult.images``) are not sent here; use the Responses or
    Anthropic bridge, which attach them as image parts.
    """
    message = _plain(assistant_message)
    calls: Sequence[Any] = (
        message.get("tool_calls") if isinstance(message, Mapping) else None
    ) or []
    out: list[OpenAIToolMessage] = []
    for raw in calls:
        call = _plain(raw)
        function = _plain(call.get("function", {}))
        result = await _run(tools, function.get("name"), function.get("arguments", "{}"))
        call_id = call.get("id")
        out.append(
            {
                "role": "tool",
                "tool_call_id": call_id if isinstance(call_id, str) else "",
                "content": _text(result),
            }
        )
    return out


def openai_assistant_message(message: Any) -> OpenAIAssistantMessage:
    """The SDK's response message as the typed parameter to send it back with.

    ``response.choices[0].message`` is a response model; ``messages=`` wants a
    parameter dict. This keeps what the API accepts back (content, tool
    calls, refusal) and drops what it does not.
    """
    data = _plain(message)
    if not isinstance(data, Mapping):
        raise TypeError("expected a Chat Completions message (a mapping or an SDK model)")
    out: OpenAIAssistantMessage = {"role": "assistant", "content": data.get("content")}
    calls = data.get("tool_calls")
    if calls:
        out["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": c.get("type", "function"),
                "function": {
                    "name": _plain(c.get("function", {})).get("name"),
                    "arguments": _plain(c.get("function", {})).get("arguments", "{}"),
                },
            }
            for c in (_plain(raw) for raw in calls)
        ]
    if data.get("refusal") is not None:
        out["refusal"] = data["refusal"]
    return out


# -- the OpenAI Responses API ---------------------------------------------------------

OpenAIResponsesTool = TypedDict(
    "OpenAIResponsesTool",
    {
        "type": Required[Literal["function"]],
        "name": Required[str],
        "description": NotRequired[str | None],
        "parameters": Required[dict[str, object] | None],
        "strict": Required[bool | None],
        "output_schema": NotRequired[dict[str, object] | None],
        "defer_loading": NotRequired[bool],
        "allowed_callers": NotRequired[Any],
        "async": NotRequired[bool],
    },
)
OpenAIResponsesTool.__doc__ = (
    "``FunctionToolParam``: one entry of the Responses API's ``tools=`` (flat, not nested). "
    "The functional form is needed for the SDK's ``async`` key."
)


class OpenAIResponsesFunctionCallOutput(TypedDict, total=False):
    """``FunctionCallOutput``: a tool's answer as a Responses API input item.

    ``call_id`` is always set here (the SDK declares it optional).
    """

    type: Required[Literal["function_call_output"]]
    call_id: str | None
    output: Required[str | list[Any]]
    id: str | None
    caller: Any
    name: str | None
    namespace: str | None
    status: Any


def openai_responses_tool(tool: Tool, *, strict: bool = True) -> OpenAIResponsesTool:
    """One tool as a Responses API function tool.

    Args:
        tool: The tool.
        strict: Use the strict-mode schema (the Responses API's default).
    """
    spec: OpenAIResponsesTool = {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": dict(tool.strict_parameters if strict else tool.parameters),
        "strict": strict,
    }
    if tool.output_schema is not None:
        spec["output_schema"] = dict(tool.output_schema)
    return spec


async def openai_responses_tool_outputs(
    tools: ToolCaller, response_output: Any
) -> list[OpenAIResponsesFunctionCallOutput]:
    """Execute the ``function_call`` items of a Responses API response.

    Args:
        response_output: The response's ``output`` (a list of items), or the
            whole response holding it.

    Returns:
        One ``function_call_output`` item per call, in order: the next
        request's ``input`` (with ``previous_response_id=response.id``).
    """
    items = _plain(response_output)
    if isinstance(items, Mapping):
        items = items.get("output", [])
    out: list[OpenAIResponsesFunctionCallOutput] = []
    for raw in items or []:
        item = _plain(raw)
        if not isinstance(item, Mapping) or item.get("type") != "function_call":
            continue
        result = await _run(tools, item.get("name"), item.get("arguments", "{}"))
        call_id = item.get("call_id")
        out.append(
            {
                "type": "function_call_output",
                "call_id": call_id if isinstance(call_id, str) else "",
                "output": _responses_output(result),
            }
        )
    return out


# -- the Anthropic Messages API -------------------------------------------------------


class AnthropicTool(TypedDict, total=False):
    """``ToolParam``: one entry of ``tools=``.

    ``input_schema`` is a JSON Schema object; ``Any`` because the SDK's type
    is a union with its own schema class.
    """

    name: Required[str]
    description: str
    input_schema: Required[Any]
    strict: bool
    type: Literal["custom"] | None
    cache_control: Any
    defer_loading: bool
    eager_input_streaming: bool | None
    input_examples: Iterable[dict[str, object]]
    allowed_callers: Any


class AnthropicToolResultBlock(TypedDict, total=False):
    """``ToolResultBlockParam``: one tool's answer inside the user message."""

    type: Required[Literal["tool_result"]]
    tool_use_id: Required[str]
    content: str | Iterable[Any]
    is_error: bool
    cache_control: Any
    toolset_name: str | None


class AnthropicToolResultMessage(TypedDict):
    """``UserMessageParam``: the user turn carrying the tool results.

    ``content`` holds :class:`AnthropicToolResultBlock` items; it is typed
    as the SDK's union so the message is assignable to ``MessageParam``.
    """

    role: Literal["user"]
    content: str | Iterable[Any]


def anthropic_tool(tool: Tool) -> AnthropicTool:
    """One tool as an Anthropic Messages API tool spec."""
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": dict(tool.parameters),
    }


async def anthropic_tool_results(
    tools: ToolCaller, assistant_content: Any
) -> AnthropicToolResultMessage:
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
    blocks: list[AnthropicToolResultBlock] = []
    for raw in content or []:
        block = _plain(raw)
        if not isinstance(block, Mapping) or block.get("type") != "tool_use":
            continue
        result = await _run(tools, block.get("name"), block.get("input", {}))
        tool_use_id = block.get("id")
        blocks.append(
            {
                "type": "tool_result",
                "tool_use_id": tool_use_id if isinstance(tool_use_id, str) else "",
                "content": _anthropic_content(result),
                "is_error": result.is_error,
            }
        )
    return {"role": "user", "content": blocks}
