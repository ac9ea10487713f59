"""A real ``Runner.run`` driven offline by a scripted ``Model`` that calls the workspace tools."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import Agent, FunctionTool, ModelResponse, ModelSettings, Runner, Usage
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import corral
from corral_openai_agents import workspace_tools

pytestmark = pytest.mark.anyio

Turn = list[tuple[str, dict[str, Any]]] | str
"""One model turn: tool calls (name, arguments) or the final text."""


class ScriptedModel(Model):
    """Plays a fixed script, like a model that knows what it wants; records what it saw.

    Arguments are sent in strict-mode form: every property the tool's schema
    requires is present (``None`` for the ones the script leaves out), as a
    model in strict mode sends them.
    """

    def __init__(self, turns: list[Turn]) -> None:
        self.turns = list(turns)
        self.inputs: list[Any] = []
        self.tools_seen: list[Any] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
        **_: Any,
    ) -> ModelResponse:
        self.inputs.append(input)
        self.tools_seen = tools
        turn = self.turns.pop(0)
        n = len(self.inputs)
        if isinstance(turn, str):
            text = ResponseOutputText(type="output_text", text=turn, annotations=[])
            message = ResponseOutputMessage(
                id=f"msg_{n}",
                type="message",
                role="assistant",
                status="completed",
                content=[text],
            )
            return ModelResponse(output=[message], usage=Usage(), response_id=None)
        by_name = {t.name: t for t in tools}
        calls = []
        for i, (name, args) in enumerate(turn):
            required = by_name[name].params_json_schema["required"]
            full = {key: args.get(key) for key in required}
            calls.append(
                ResponseFunctionToolCall(
                    type="function_call",
                    name=name,
                    arguments=json.dumps(full),
                    call_id=f"call_{n}_{i}",
                    id=f"fc_{n}_{i}",
                    status="completed",
                )
            )
        return ModelResponse(output=list(calls), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the tests only run the non-streaming path")

    def outputs(self) -> dict[str, str]:
        """Every tool output the model was sent back, by call id."""
        found: dict[str, str] = {}
        for items in self.inputs:
            for item in items if isinstance(items, list) else []:
                if isinstance(item, dict) and item.get("type") == "function_call_output":
                    found[item["call_id"]] = item["output"]
        return found


@pytest.fixture(params=["in-memory", "local-bash"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_agent_writes_then_reads_a_file(kind: str) -> None:
    model = ScriptedModel(
        [
            [("workspace_write_file", {"path": "/notes.txt", "content": "hello from the agent"})],
            [("workspace_read_file", {"path": "/notes.txt"})],
            "done",
        ]
    )
    async with corral.open_workspace(kind, {"fs": True}) as ws:
        agent = Agent(name="writer", model=model, tools=workspace_tools(ws))
        result = await Runner.run(agent, "write notes.txt and read it back")
        assert result.final_output == "done"
        outputs = model.outputs()
        assert not outputs["call_1_0"].startswith("error:"), outputs["call_1_0"]
        assert outputs["call_2_0"] == "hello from the agent"
        # The file is really in the workspace, not only in the transcript.
        check = await ws.call("workspace_read_file", {"path": "/notes.txt"})
        assert check.data["content"] == "hello from the agent"


async def test_failed_call_reaches_the_model_and_the_run_goes_on() -> None:
    model = ScriptedModel(
        [
            [("workspace_read_file", {"path": "/missing.txt"}), ("workspace_ls", {"path": "/"})],
            "recovered",
        ]
    )
    async with corral.open_workspace("in-memory", {"fs": True}) as ws:
        agent = Agent(name="reader", model=model, tools=workspace_tools(ws))
        result = await Runner.run(agent, "read missing.txt")
    assert result.final_output == "recovered"
    outputs = model.outputs()
    assert outputs["call_1_0"].startswith("error: ")
    assert not outputs["call_1_1"].startswith("error:")


async def test_shell_env_in_strict_form_runs_on_local_bash() -> None:
    model = ScriptedModel(
        [
            [("workspace_write_file", {"path": "/a.txt", "content": "from a file"})],
            [
                ("workspace_run", {"command": "cat a.txt"}),
                (
                    "workspace_run",
                    {"command": "printenv GREETING", "env": [{"name": "GREETING", "value": "hi"}]},
                ),
            ],
            "ran",
        ]
    )
    async with corral.open_workspace("local-bash", {"fs": True, "shell": True}) as ws:
        agent = Agent(name="runner", model=model, tools=workspace_tools(ws))
        result = await Runner.run(agent, "run things")
    assert result.final_output == "ran"
    outputs = model.outputs()
    assert json.loads(outputs["call_2_0"])["stdout"] == "from a file"
    assert json.loads(outputs["call_2_1"])["stdout"] == "hi\n"
    run_tool = next(t for t in model.tools_seen if t.name == "workspace_run")
    assert isinstance(run_tool, FunctionTool)
    assert run_tool.strict_json_schema


async def test_sync_session_tools_run_on_the_agents_loop() -> None:
    """A corral.sync session's tools are bound to the portal's loop, not the runner's."""
    model = ScriptedModel([[("workspace_write_file", {"path": "/s.txt", "content": "sync"})], "ok"])
    threads: set[int] = set()

    def record(event: corral.Event) -> None:
        threads.add(threading.get_ident())

    # The session's loop is trio's, the runner's asyncio's: calls must cross between them.
    with corral.sync.open_workspace(
        "local-bash", {"fs": True}, backend="trio", observers=[record]
    ) as ws:
        agent = Agent(name="sync", model=model, tools=workspace_tools(ws))
        result = await Runner.run(agent, "write")
        assert result.final_output == "ok"
        assert ws.call("workspace_read_file", {"path": "/s.txt"}).data["content"] == "sync"
    # Every event, the tool calls' included, came from the portal's loop thread.
    assert len(threads) == 1


async def test_invalid_json_arguments_are_an_error_without_echo() -> None:
    async with corral.open_workspace("in-memory", {"fs": True}) as ws:
        tool = next(t for t in workspace_tools(ws) if t.name == "workspace_ls")
        assert isinstance(tool, FunctionTool)
        out = await tool.on_invoke_tool(None, '{"path": "SECRET-PAYLOAD"')  # type: ignore[arg-type]
    assert out == "error: tool arguments are not valid JSON"
