"""Strict-mode schemas, the Responses API format, tool hints and result schemas."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any

import attrs
import pytest

import corral
import corral.capability
from corral import OperationError
from corral._builtin_capabilities import BUILTIN_CAPABILITIES
from corral.capability import Arg, args_schema

pytestmark = pytest.mark.anyio

ALL_CAPS: dict[str, Any] = {
    "fs": True,
    "shell": True,
    "code": {"languages": ["python"], "is_stateful": True},
    "script": True,
    "snapshot": True,
    "process": True,
}


def builtin_specs() -> list[Any]:
    specs = []
    for cap in BUILTIN_CAPABILITIES:
        specs += cap.tools(cap.parse_policy(ALL_CAPS[cap.name]))
    return specs


@attrs.frozen(kw_only=True)
class Mixed:
    name: Annotated[str, Arg("A name", min_length=2, max_length=5)]
    count: Annotated[int, Arg("How many", minimum=1)] = 3
    where: Annotated[str | None, Arg(path=True)] = None
    labels: dict[str, int] = attrs.field(factory=dict)


def test_strict_schema_lists_everything_and_has_no_open_maps() -> None:
    assert args_schema(Mixed, strict=True).json_schema == {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "A name"},
            "count": {
                "anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
                "description": "How many. Default: 3.",
            },
            "where": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "labels": {
                "anyOf": [
                    {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string"},
                                "value": {"type": "integer"},
                            },
                            "required": ["name", "value"],
                            "additionalProperties": False,
                        },
                    },
                    {"type": "null"},
                ]
            },
        },
        "required": ["name", "count", "where", "labels"],
        "additionalProperties": False,
    }


def test_strict_parsing_takes_both_forms_and_ordinary_parsing_is_unchanged() -> None:
    strict = args_schema(Mixed, strict=True)
    sent = {"name": "ab", "count": None, "where": None, "labels": [{"name": "k", "value": 2}]}
    assert strict.parse(sent) == Mixed(name="ab", labels={"k": 2})
    assert strict.parse({"name": "ab", "labels": {"k": 2}}) == Mixed(name="ab", labels={"k": 2})
    assert strict.parse({"name": "ab", "count": 7}).count == 7
    ordinary = args_schema(Mixed)
    for bad in ({"name": "ab", "count": None}, {"name": "ab", "labels": []}):
        with pytest.raises(OperationError):
            ordinary.parse(bad)


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (
            [{"name": "k", "value": 1}, {"name": "k", "value": 2}],
            "labels[1]': a name appears twice",
        ),
        ([{"name": "k"}], "labels[0]': expected an object with exactly 'name' and 'value'"),
        ([{"name": 3, "value": 1}], "labels[0]': 'name' must be a string"),
        ([{"name": "SECRET", "value": "SECRET"}], "labels.SECRET': expected an integer"),
        ("SECRET", "labels': expected an array of {name, value} objects"),
    ],
)
def test_strict_map_errors_name_the_entry(labels: Any, message: str) -> None:
    with pytest.raises(OperationError) as info:
        args_schema(Mixed, strict=True).parse({"name": "ab", "labels": labels})
    assert message in info.value.message
    assert info.value.code == "invalid_argument"


def test_strict_parsing_still_refuses_null_for_a_required_argument() -> None:
    with pytest.raises(OperationError, match="argument 'name': expected a string"):
        args_schema(Mixed, strict=True).parse({"name": None})


def _objects(schema: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(schema, dict):
        if schema.get("type") == "object":
            yield where, schema
        for key, value in schema.items():
            yield from _objects(value, f"{where}/{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from _objects(value, f"{where}/{i}")


def _keys(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            yield key
            if key != "properties":
                yield from _keys(value)
            else:
                for prop in value.values():
                    yield from _keys(prop)
    elif isinstance(schema, list):
        for value in schema:
            yield from _keys(value)


@pytest.mark.parametrize("spec", builtin_specs(), ids=lambda s: s.name)
def test_every_builtin_strict_schema_follows_openai_strict_mode(spec: Any) -> None:
    schema = spec.strict_parameters
    for where, obj in _objects(schema):
        assert obj.get("additionalProperties") is False, where
        assert "properties" in obj, f"{where}: an open map"
        assert obj["required"] == list(obj["properties"]), where
    assert not {"default", "minLength", "maxLength"} & set(_keys(schema))


@pytest.mark.parametrize("spec", builtin_specs(), ids=lambda s: s.name)
def test_every_builtin_tool_declares_hints_and_a_result_schema(spec: Any) -> None:
    hints = spec.hints
    assert isinstance(hints, corral.capability.ToolHints)
    reads = {
        "workspace_read_file",
        "workspace_ls",
        "workspace_glob",
        "workspace_grep",
        "workspace_stat",
        "workspace_list_snapshots",
        "workspace_read_file_at_snapshot",
        "workspace_changes_since_snapshot",
        "workspace_script",
        "workspace_read_process_output",
        "workspace_list_processes",
        "workspace_terminal_screen",
    }
    assert hints.read_only == (spec.name in reads)
    if spec.name in {"workspace_rm", "workspace_write_file", "workspace_restore"}:
        assert hints.destructive
    if spec.name in {"workspace_run", "workspace_run_code"}:
        assert hints.open_world
    assert spec.output_schema["type"] == "object"


async def test_exports_carry_strict_schemas_hints_and_result_schemas() -> None:
    async with corral.open_workspace("in-memory", {"fs": True}) as ws:
        chat = ws.openai_tools()
        chat_strict = ws.openai_tools(strict=True)
        responses = ws.openai_responses_tools()
        loose = ws.openai_responses_tools(strict=False)
        claude = ws.anthropic_tools()
        names = [t.name for t in ws.tools]
        read = ws.toolset.tool("workspace_read_file")
    assert [t["function"]["name"] for t in chat] == names == [t["name"] for t in responses]
    assert [t["name"] for t in claude] == names
    assert "strict" not in chat[0]["function"]
    assert chat_strict[0]["function"]["strict"] is True
    assert chat_strict[0]["function"]["parameters"] == read.strict_parameters
    first = responses[0]
    assert first["type"] == "function"
    assert first["strict"] is True
    assert first["parameters"] == read.strict_parameters
    assert first.get("output_schema") == read.output_schema
    assert loose[0]["strict"] is False
    assert loose[0]["parameters"] == read.parameters
    assert read.hints == corral.capability.ToolHints(
        read_only=True, destructive=False, idempotent=True, open_world=False
    )


async def test_bridges_accept_strict_arguments_and_never_raise() -> None:
    async with corral.open_workspace("in-memory", {"fs": True}, raise_on_error=True) as ws:
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "workspace_write_file",
                        "arguments": json.dumps({"path": "/a", "content": "x", "encoding": None}),
                    },
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "workspace_read_file", "arguments": '{"path": "/nope"}'},
                },
            ],
        }
        replies = await corral.openai_tool_messages(ws, message)
        outputs = await corral.openai_responses_tool_outputs(
            ws,
            {
                "output": [
                    {"type": "message", "content": []},
                    {
                        "type": "function_call",
                        "call_id": "f1",
                        "name": "workspace_read_file",
                        "arguments": json.dumps({"path": "/a", "offset": None, "limit": None}),
                    },
                ]
            },
        )
    assert [r["tool_call_id"] for r in replies] == ["c1", "c2"]
    assert json.loads(str(replies[0]["content"])) == {"path": "/a", "bytes_written": 1}
    assert str(replies[1]["content"]).startswith("error: ")
    assert outputs == [{"type": "function_call_output", "call_id": "f1", "output": "x"}]
    assert corral.openai_assistant_message(message) == {
        "role": "assistant",
        "content": None,
        "tool_calls": message["tool_calls"],
    }
    with pytest.raises(TypeError):
        corral.openai_assistant_message("not a message")
