"""Every built-in tool's schema is accepted by the SDK's default strict mode."""

from __future__ import annotations

import pytest
from agents import FunctionTool
from agents.exceptions import UserError

import corral
from corral import ToolResult
from corral_openai_agents import workspace_tools


async def _unused(arguments: object, strict: bool) -> ToolResult:
    raise AssertionError("construction must not call the tool")


def _every_builtin_tool() -> list[corral.Tool]:
    """The tools of every capability corral registers, with default policies.

    Built from the capabilities themselves, not a workspace: no single
    provider populates all of them (code, script).
    """
    plugins = corral.load_plugins()
    tools = []
    for cap in plugins.capabilities.values():
        for spec in cap.tools(cap.parse_policy(True)):
            tools.append(
                corral.Tool(
                    spec.name,
                    spec.description,
                    spec.parameters,
                    cap.name,
                    invoke=_unused,
                    strict_parameters=spec.strict_parameters,
                )
            )
    return tools


def _function_tools(tools: list[corral.Tool], *, strict: bool = True) -> list[FunctionTool]:
    converted = workspace_tools(tools, strict=strict)
    assert all(isinstance(t, FunctionTool) for t in converted)
    return [t for t in converted if isinstance(t, FunctionTool)]


def test_every_builtin_tool_is_accepted_in_strict_mode() -> None:
    tools = _every_builtin_tool()
    names = {t.name for t in tools}
    assert {"workspace_run", "workspace_write_file", "workspace_snapshot"} <= names
    converted = _function_tools(tools)
    assert [t.name for t in converted] == [t.name for t in tools]
    for tool in converted:
        assert tool.strict_json_schema
        assert tool.params_json_schema["additionalProperties"] is False


def test_workspace_run_env_is_a_name_value_list() -> None:
    run = next(t for t in _function_tools(_every_builtin_tool()) if t.name == "workspace_run")
    env = run.params_json_schema["properties"]["env"]
    array = next(s for s in env["anyOf"] if s.get("type") == "array")
    assert array["items"]["required"] == ["name", "value"]


def test_the_ordinary_schema_is_what_strict_mode_refuses() -> None:
    """Why the strict schemas matter: the open ``env`` map fails the SDK's check."""
    run = next(t for t in _every_builtin_tool() if t.name == "workspace_run")
    with pytest.raises(UserError):
        FunctionTool(
            name=run.name,
            description=run.description,
            params_json_schema=dict(run.parameters),
            on_invoke_tool=_unused,  # type: ignore[arg-type]
        )
    relaxed = _function_tools([run], strict=False)
    assert relaxed[0].strict_json_schema is False


def test_bad_source_is_a_clear_type_error() -> None:
    with pytest.raises(TypeError, match=r"corral\.Tool"):
        workspace_tools(["workspace_run"])  # type: ignore[list-item]
