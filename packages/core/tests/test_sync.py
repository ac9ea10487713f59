"""``corral.sync``: the blocking facade, on every provider (real ones gated as in CI)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import corral
from corral import ConfigError, ToolCallError, ToolResult, WorkspaceFailedError
from corral.sync import BlockingWorkspace, SyncWorkspaceSession, open_workspace

from ._real_providers import KINDS, provider_options, require


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    require(str(request.param))
    return str(request.param)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_readme_flow_without_async(kind: str, tmp_path: Path, backend: str) -> None:
    spec = corral.default_plugins().provider(kind)
    caps = {name: True for name in ("fs", "shell", "snapshot") if name in spec.capabilities}
    with open_workspace(
        kind, caps, provider_options=provider_options(kind, tmp_path), backend=backend
    ) as ws:
        assert isinstance(ws, SyncWorkspaceSession)
        assert ws.ref is not None  # opened eagerly
        written = ws.call("workspace_write_file", {"path": "/a.txt", "content": "hi\n"})
        assert isinstance(written, ToolResult)
        assert not written.is_error
        read = ws.call("workspace_read_file", {"path": "/a.txt"})
        assert read.data is not None
        assert read.data["content"] == "hi\n"
        names = [t.name for t in ws.tools]
        assert [t["function"]["name"] for t in ws.openai_tools()] == names
        assert [t["name"] for t in ws.anthropic_tools()] == names
        if "snapshot" in caps:
            snap = ws.call("workspace_snapshot", {"label": "one"}, raise_on_error=True)
            assert snap.data is not None
            assert snap.data["snapshot_id"]
        if "shell" in caps:
            ran = ws.call("workspace_run", {"command": "cat a.txt"}, raise_on_error=True)
            assert ran.data is not None
            assert ran.data["stdout"] == "hi\n"
        with pytest.raises(ToolCallError) as info:
            ws.call("workspace_read_file", {"path": "/missing"}, raise_on_error=True)
        assert info.value.code == "not_found"
        workspace = ws.workspace()
        assert isinstance(workspace, BlockingWorkspace)
        assert workspace.fs is not None
        assert workspace.fs.read_file("/a.txt") == b"hi\n"
        assert ws.describe().state == "open"
        ref = ws.ref
    assert ref is not None


def test_thread_safe_calls_from_many_threads(kind: str, tmp_path: Path) -> None:
    with open_workspace(
        kind, {"fs": True}, provider_options=provider_options(kind, tmp_path)
    ) as ws:
        errors: list[BaseException] = []

        def writer(n: int) -> None:
            try:
                for i in range(5):
                    ws.call(
                        "workspace_write_file",
                        {"path": f"/t{n}/f{i}.txt", "content": str(i)},
                        raise_on_error=True,
                    )
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        listing = ws.call("workspace_glob", {"pattern": "**/*.txt"}, raise_on_error=True)
        assert listing.data is not None
        assert len(listing.data["matches"]) == 20


def test_open_failures_raise_the_same_types() -> None:
    with (
        pytest.raises(ConfigError, match="cannot populate capabilities: shell"),
        open_workspace("in-memory", {"shell": True}),
    ):
        pass
    require("local-sandbox")
    from corral_local_sandbox import LocalSandboxProvider

    provider = LocalSandboxProvider(bwrap_path="/nonexistent/bwrap")
    with (
        pytest.raises(WorkspaceFailedError, match="bubblewrap"),
        open_workspace(provider, {"fs": True, "shell": True}),
    ):
        pass
