"""The LangChain tools, invoked one by one and in a tool-calling loop with a fake chat model."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.tools import BaseTool

import corral
import corral.sync
from corral_langchain import workspace_tools

pytestmark = pytest.mark.anyio

Args = Callable[[dict[str, Any]], dict[str, Any]]
"""Arguments of one call, built from the artifacts of earlier calls (by tool name)."""

EVERY_TOOL: list[tuple[str, Args]] = [
    ("workspace_write_file", lambda _: {"path": "/d/a.txt", "content": "alpha\n"}),
    ("workspace_read_file", lambda _: {"path": "/d/a.txt"}),
    (
        "workspace_edit_file",
        lambda _: {"path": "/d/a.txt", "old_text": "alpha", "new_text": "beta"},
    ),
    ("workspace_ls", lambda _: {"path": "/d"}),
    ("workspace_glob", lambda _: {"pattern": "**/*.txt"}),
    ("workspace_grep", lambda _: {"pattern": "beta"}),
    ("workspace_stat", lambda _: {"path": "/d/a.txt"}),
    ("workspace_mkdir", lambda _: {"path": "/e/f", "parents": True}),
    ("workspace_run", lambda _: {"command": "cat d/a.txt", "env": {"X": "1"}}),
    ("workspace_snapshot", lambda _: {"label": "one"}),
    ("workspace_list_snapshots", lambda _: {}),
    ("workspace_changes_since_snapshot", lambda seen: {"snapshot_id": _sid(seen)}),
    (
        "workspace_read_file_at_snapshot",
        lambda seen: {"snapshot_id": _sid(seen), "path": "/d/a.txt"},
    ),
    ("workspace_restore", lambda seen: {"snapshot_id": _sid(seen)}),
    ("workspace_delete_snapshot", lambda seen: {"snapshot_id": _sid(seen)}),
    ("workspace_rm", lambda _: {"path": "/e", "recursive": True}),
    ("workspace_snapshot", lambda _: {"label": "two"}),
    # Last: the session moves to a new workspace made from the snapshot.
    ("workspace_branch", lambda seen: {"snapshot_id": _sid(seen)}),
]
"""A valid call of every tool of fs + shell + snapshot, in an order where each makes sense."""


def _sid(seen: dict[str, Any]) -> str:
    return str(seen["workspace_snapshot"]["snapshot_id"])


CAPABILITIES = {
    "in-memory": {"fs": True, "snapshot": True},
    "local-bash": {"fs": True, "shell": True, "snapshot": True},
}


@pytest.fixture(params=sorted(CAPABILITIES))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _call(name: str, args: dict[str, Any], call_id: str) -> ToolCall:
    return ToolCall(name=name, args=args, id=call_id, type="tool_call")


def _plan(tools: list[BaseTool]) -> list[tuple[str, Args]]:
    names = [t.name for t in tools]
    plan = [(name, args) for name, args in EVERY_TOOL if name in names]
    assert {name for name, _ in plan} == set(names), "a tool has no call in EVERY_TOOL"
    return plan


async def test_every_tool_ainvoke(kind: str) -> None:
    async with corral.open_workspace(kind, CAPABILITIES[kind]) as ws:
        tools = {t.name: t for t in workspace_tools(ws)}
        seen: dict[str, Any] = {}
        for i, (name, args) in enumerate(_plan(list(tools.values()))):
            message = await tools[name].ainvoke(_call(name, args(seen), f"c{i}"))
            assert isinstance(message, ToolMessage)
            assert message.status == "success", (name, message.content)
            assert message.tool_call_id == f"c{i}"
            seen[name] = message.artifact
        assert seen["workspace_read_file"]["content"] == "alpha\n"
        assert seen["workspace_read_file_at_snapshot"]["content"] == "beta\n"


def test_every_tool_invoke_with_a_sync_session(kind: str) -> None:
    threads: set[int] = set()

    def record(event: corral.Event) -> None:
        threads.add(threading.get_ident())

    with corral.sync.open_workspace(kind, CAPABILITIES[kind], observers=[record]) as ws:
        tools = {t.name: t for t in workspace_tools(ws)}
        seen: dict[str, Any] = {}
        for i, (name, args) in enumerate(_plan(list(tools.values()))):
            message = tools[name].invoke(_call(name, args(seen), f"c{i}"))
            assert message.status == "success", (name, message.content)
            seen[name] = message.artifact
    assert seen["workspace_edit_file"] is not None
    assert len(threads) == 1  # every call ran on the session's own loop thread


async def test_sync_session_tools_also_ainvoke() -> None:
    threads: set[int] = set()

    def record(event: corral.Event) -> None:
        threads.add(threading.get_ident())

    # The session's loop is trio's, the caller's may be anything: calls cross over.
    with corral.sync.open_workspace(
        "local-bash", {"fs": True}, backend="trio", observers=[record]
    ) as ws:
        (write,) = (t for t in workspace_tools(ws) if t.name == "workspace_write_file")
        message = await write.ainvoke(_call(write.name, {"path": "/x", "content": "y"}, "c"))
        assert message.status == "success"
        assert ws.call("workspace_read_file", {"path": "/x"}).data["content"] == "y"
    assert len(threads) == 1


async def test_async_session_refuses_sync_invoke() -> None:
    async with corral.open_workspace("in-memory", {"fs": True}) as ws:
        (ls,) = (t for t in workspace_tools(ws) if t.name == "workspace_ls")
        with pytest.raises(NotImplementedError):
            ls.invoke({"path": "/"})


async def test_errors_are_error_messages_without_echo() -> None:
    async with corral.open_workspace("in-memory", {"fs": True}) as ws:
        tools = {t.name: t for t in workspace_tools(ws)}
        missing = await tools["workspace_read_file"].ainvoke(
            _call("workspace_read_file", {"path": "/missing.txt"}, "a")
        )
        bad = await tools["workspace_ls"].ainvoke(
            _call("workspace_ls", {"path": "/", "no_such_argument": 1}, "b")
        )
    assert missing.status == "error"
    assert missing.content == "error: /missing.txt: no such file or directory"
    assert bad.status == "error"
    assert "unknown argument" in bad.content


async def _loop(model: GenericFakeChatModel, tools: Sequence[BaseTool]) -> list[BaseMessage]:
    """The plain tool-calling loop: ask, run every tool call, repeat until no calls."""
    by_name = {t.name: t for t in tools}
    messages: list[BaseMessage] = [HumanMessage("write notes.txt and read it back")]
    while True:
        reply = await model.ainvoke(messages)
        assert isinstance(reply, AIMessage)
        messages.append(reply)
        if not reply.tool_calls:
            return messages
        for call in reply.tool_calls:
            messages.append(await by_name[call["name"]].ainvoke(call))


async def test_tool_calling_loop_with_a_fake_chat_model(kind: str) -> None:
    turns = [
        AIMessage(
            "",
            tool_calls=[
                _call("workspace_write_file", {"path": "/notes.txt", "content": "hi there"}, "1")
            ],
        ),
        AIMessage("", tool_calls=[_call("workspace_read_file", {"path": "/notes.txt"}, "2")]),
        AIMessage("done"),
    ]
    model = GenericFakeChatModel(messages=iter(turns))
    async with corral.open_workspace(kind, {"fs": True}) as ws:
        messages = await _loop(model, workspace_tools(ws))
        check = await ws.call("workspace_read_file", {"path": "/notes.txt"})
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in results] == ["1", "2"]
    assert results[1].content == "hi there"
    assert messages[-1].content == "done"
    assert check.data["content"] == "hi there"
