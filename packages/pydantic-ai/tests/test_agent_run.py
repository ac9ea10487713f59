"""A real pydantic-ai ``Agent`` run, driven offline by ``FunctionModel``, on the workspace."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import corral
from corral_pydantic_ai import workspace_tools, workspace_toolset

pytestmark = pytest.mark.anyio

Turn = list[tuple[str, dict[str, Any]]] | str
"""One model turn: tool calls (name, arguments) or the final text."""


class Script:
    """A ``FunctionModel`` function that plays fixed turns and records the tools it was shown."""

    def __init__(self, turns: list[Turn]) -> None:
        self.turns = list(turns)
        self.tool_names: list[str] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.tool_names = [t.name for t in info.function_tools]
        turn = self.turns.pop(0)
        if isinstance(turn, str):
            return ModelResponse(parts=[TextPart(turn)])
        return ModelResponse(parts=[ToolCallPart(name, args) for name, args in turn])


def returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    """Every tool result the model was sent back, in order."""
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


@pytest.fixture(params=["in-memory", "local-bash"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_agent_writes_then_reads_a_file(kind: str) -> None:
    script = Script(
        [
            [("workspace_write_file", {"path": "/notes.txt", "content": "hello from the agent"})],
            [("workspace_read_file", {"path": "/notes.txt"})],
            "done",
        ]
    )
    agent = Agent(FunctionModel(script))
    async with corral.open_workspace(kind, {"fs": True}) as ws:
        result = await agent.run("write and read back", toolsets=[workspace_toolset(ws)])
        check = await ws.call("workspace_read_file", {"path": "/notes.txt"})
    assert result.output == "done"
    write, read = returns(result.all_messages())
    assert write.outcome == "success"
    assert read.outcome == "success"
    assert read.content == "hello from the agent"
    assert check.data["content"] == "hello from the agent"
    assert "workspace_write_file" in script.tool_names


async def test_shell_on_local_bash_sees_the_written_file() -> None:
    script = Script(
        [
            [("workspace_write_file", {"path": "/a.txt", "content": "from a file"})],
            [("workspace_run", {"command": "cat a.txt", "env": {"UNUSED": "1"}})],
            "ran",
        ]
    )
    agent = Agent(FunctionModel(script))
    async with corral.open_workspace("local-bash", {"fs": True, "shell": True}) as ws:
        result = await agent.run("run", toolsets=[workspace_toolset(ws)])
    _, run = returns(result.all_messages())
    assert run.outcome == "success"
    assert '"stdout": "from a file"' in str(run.content)


async def test_a_failed_operation_is_terminal_and_bad_arguments_retry() -> None:
    script = Script(
        [
            [
                ("workspace_read_file", {"path": "/missing.txt"}),
                ("workspace_ls", {"path": "/", "no_such_argument": 1}),
            ],
            "adapted",
        ]
    )
    agent = Agent(FunctionModel(script))
    async with corral.open_workspace("in-memory", {"fs": True}) as ws:
        result = await agent.run("go", toolsets=[workspace_toolset(ws)])
    assert result.output == "adapted"
    missing, bad = returns(result.all_messages())
    assert missing.outcome == "failed"  # ToolFailed: no retry budget spent
    assert missing.content == "/missing.txt: no such file or directory"
    assert bad.outcome == "retried"  # ModelRetry: the model is asked to fix its arguments
    assert "unknown argument 'no_such_argument'" in str(bad.content)


async def test_test_model_accepts_every_schema(kind: str) -> None:
    """TestModel generates arguments from each schema and calls every tool once."""
    async with corral.open_workspace(kind, {"fs": True}) as ws:
        tools = workspace_tools(ws)
        model = TestModel(call_tools=["workspace_write_file", "workspace_ls"])
        agent = Agent(model, tools=tools)
        result = await agent.run("go")
    outcomes = {p.tool_name: p.outcome for p in returns(result.all_messages())}
    assert outcomes["workspace_ls"] == "success"
    assert set(outcomes) == {"workspace_write_file", "workspace_ls"}
    assert [t.name for t in tools] == [t.name for t in ws.tools]


def test_run_sync_with_a_sync_session() -> None:
    """Blocking code: a corral.sync session under ``agent.run_sync`` (a loop of its own)."""
    script = Script([[("workspace_write_file", {"path": "/s.txt", "content": "sync"})], "ok"])
    agent = Agent(FunctionModel(script))
    threads: set[int] = set()

    def record(event: corral.Event) -> None:
        threads.add(threading.get_ident())

    # The session's loop is trio's, the agent's asyncio's: calls must cross between them.
    with corral.sync.open_workspace(
        "local-bash", {"fs": True}, backend="trio", observers=[record]
    ) as ws:
        result = agent.run_sync("write", toolsets=[workspace_toolset(ws)])
        assert result.output == "ok"
        assert ws.call("workspace_read_file", {"path": "/s.txt"}).data["content"] == "sync"
    # Every event, the tool calls' included, came from the portal's loop thread.
    assert len(threads) == 1
