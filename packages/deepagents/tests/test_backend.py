"""CorralBackend's own contract: one path namespace, policies, sessions, a real agent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from deepagents import create_deep_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolCall, ToolMessage

import corral
import corral.sync
from corral_deepagents import CorralBackend

pytestmark = pytest.mark.anyio

SHELL = {"allow_shell_syntax": True}


class ScriptedModel(GenericFakeChatModel):
    """LangChain's offline fake chat model; deepagents binds its tools, the script ignores them."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self


def _call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage("", tool_calls=[ToolCall(name=name, args=args, id=call_id, type="tool_call")])


def _tool_messages(messages: list[BaseMessage]) -> dict[str, str]:
    return {str(m.tool_call_id): str(m.content) for m in messages if isinstance(m, ToolMessage)}


@pytest.fixture
def bash() -> Iterator[tuple[CorralBackend, str]]:
    with corral.sync.open_workspace("local-bash", {"fs": True, "shell": SHELL}) as ws:
        yield CorralBackend(ws), ws.describe().details["workspace_path"]


def test_agent_writes_runs_and_reads_through_the_backend() -> None:
    with corral.sync.open_workspace("local-bash", {"fs": True, "shell": SHELL}) as ws:
        root = ws.describe().details["workspace_path"]
        turns = [
            _call("write_file", {"file_path": f"{root}/notes.txt", "content": "hi there"}, "w"),
            _call("execute", {"command": "cat notes.txt"}, "x"),
            _call("read_file", {"file_path": f"{root}/notes.txt"}, "r"),
            AIMessage("done"),
        ]
        agent = create_deep_agent(
            model=ScriptedModel(messages=iter(turns)), backend=CorralBackend(ws)
        )
        out = agent.invoke({"messages": [{"role": "user", "content": "write notes.txt"}]})
        on_disk = ws.call("workspace_read_file", {"path": "/notes.txt"}).data["content"]
    results = _tool_messages(out["messages"])
    assert on_disk == "hi there"
    assert results["x"].startswith("hi there")
    assert "exit code 0" in results["x"]
    assert results["r"].endswith("hi there")
    assert out["messages"][-1].content == "done"


async def test_agent_on_an_async_session() -> None:
    async with corral.open_workspace("in-memory", {"fs": True}) as ws:
        turns = [
            _call("write_file", {"file_path": "/a/b.txt", "content": "one\ntwo"}, "w"),
            _call(
                "edit_file",
                {"file_path": "/a/b.txt", "old_string": "two", "new_string": "2"},
                "e",
            ),
            _call("grep", {"pattern": "2", "path": "/a"}, "g"),
            AIMessage("done"),
        ]
        agent = create_deep_agent(
            model=ScriptedModel(messages=iter(turns)), backend=CorralBackend(ws)
        )
        out = await agent.ainvoke({"messages": [{"role": "user", "content": "go"}]})
        check = await ws.call("workspace_read_file", {"path": "/a/b.txt"})
    assert check.data["content"] == "one\n2"
    assert "/a/b.txt" in _tool_messages(out["messages"])["g"]


def test_paths_outside_the_workspace_are_refused(bash: tuple[CorralBackend, str]) -> None:
    backend, root = bash
    outside = backend.write("/tmp/corral-deepagents-outside.txt", "x")
    escape = backend.upload_files([(f"{root}/../escape.txt", b"x")])
    relative = backend.read("notes.txt")
    assert outside.error is not None
    assert "outside the workspace" in outside.error
    assert escape[0].error == "invalid_path"
    assert relative.error is not None
    assert "absolute" in relative.error
    assert backend.execute("ls /tmp/corral-deepagents-outside.txt").exit_code != 0
    assert backend.ls(root).entries == []


def test_a_file_has_one_name_for_files_and_commands(bash: tuple[CorralBackend, str]) -> None:
    backend, root = bash
    assert backend.execute("mkdir -p d && printf 'a|b\\n' > d/x.txt").exit_code == 0
    (grep,) = backend.grep("a|b", path=root).matches or []
    assert grep["path"] == f"{root}/d/x.txt"
    assert backend.execute(f"cat {grep['path']}").output == "a|b\n"


def test_glob_follows_deepagents_rules(bash: tuple[CorralBackend, str]) -> None:
    backend, root = bash
    backend.upload_files([(f"{root}/{p}", b"") for p in ("top.py", "src/app/main.py", ".ci/x.py")])
    bare = backend.glob("*.py", path=root).matches or []
    anchored = backend.glob("/*.py", path=root).matches or []
    starred = backend.glob("**/*.py", path=root).matches or []
    every = (".ci/x.py", "src/app/main.py", "top.py")
    assert [m["path"] for m in bare] == [f"{root}/{p}" for p in every]
    assert [m["path"] for m in anchored] == [f"{root}/top.py"]
    assert [m["path"] for m in starred] == [f"{root}/src/app/main.py", f"{root}/top.py"]
    assert backend.glob("../*.py", path=root).error is not None


def test_grep_is_literal_and_capped(bash: tuple[CorralBackend, str]) -> None:
    backend, root = bash
    backend.write(f"{root}/f.txt", "x.*\nxyz\nx.*\nx.*\n")
    capped = backend.grep("x.*", path=root, max_count=2)
    exact = backend.grep("x.*", path=root, max_count=3)
    assert [m["line"] for m in capped.matches or []] == [1, 3]
    assert capped.truncated
    assert [m["line"] for m in exact.matches or []] == [1, 3, 4]
    assert not exact.truncated


def test_read_only_policy_is_kept() -> None:
    with corral.sync.open_workspace("in-memory", {"fs": {"read_only": True}}) as ws:
        backend = CorralBackend(ws)
        assert backend.write("/a.txt", "x").error is not None
        assert backend.upload_files([("/a.txt", b"x")])[0].error == "permission_denied"
        assert backend.edit("/a.txt", "x", "y").error is not None
        assert backend.delete("/a.txt").error is not None
        assert backend.ls("/").entries == []


def test_shell_policy_is_kept() -> None:
    caps = {"fs": True, "shell": {"allowed_commands": ["cat"]}}
    with corral.sync.open_workspace("local-bash", caps) as ws:
        backend = CorralBackend(ws)
        root = ws.describe().details["workspace_path"]
        backend.write(f"{root}/keep.txt", "x")
        refused = backend.execute("rm keep.txt")
        allowed = backend.execute("cat keep.txt")
    assert refused.exit_code is None
    assert "allowed" in refused.output
    assert allowed.output == "x"


def test_without_a_shell_execute_is_an_error() -> None:
    with corral.sync.open_workspace("in-memory", {"fs": True}) as ws:
        result = CorralBackend(ws).execute("ls")
    assert result.exit_code is None
    assert "shell capability" in result.output


async def test_an_async_session_refuses_blocking_calls() -> None:
    async with corral.open_workspace("in-memory", {"fs": True}) as ws:
        backend = CorralBackend(ws)
        with pytest.raises(NotImplementedError, match=r"corral\.sync"):
            backend.ls("/")
        assert (await backend.als("/")).entries == []
        assert backend.id.startswith("corral-")


async def test_a_trio_sync_session_serves_asyncio_callers() -> None:
    with corral.sync.open_workspace("in-memory", {"fs": True}, backend="trio") as ws:
        backend = CorralBackend(ws)
        assert (await backend.awrite("/x.txt", "y")).error is None
        assert (await backend.adownload_files(["/x.txt"]))[0].content == b"y"


def test_a_non_session_is_refused() -> None:
    with pytest.raises(TypeError, match="corral"):
        CorralBackend(object())  # type: ignore[arg-type]
