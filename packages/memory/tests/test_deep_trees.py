"""Deep and wide trees (issue 11, item 8): nothing in the in-memory provider
recurses per level, so every operation works (or fails cleanly) at any depth."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

import corral
import corral.provider
from corral_memory import InMemoryProvider
from corral_memory._store import find
from corral_memory._tree import DirNode, FileNode

pytestmark = pytest.mark.anyio

# The deepest tree the fs tools can build: every path is at most 4096 bytes.
TOOL_DEPTH = (4096 - len("/leaf.txt")) // 2
DEPTH = 10_000  # beyond any path: built directly
assert sys.getrecursionlimit() < TOOL_DEPTH


async def _exercise(
    provider: InMemoryProvider,
    ws: corral.provider.Workspace,
    deep_dir: str,
    compile_pattern: Callable[..., corral.provider.Matcher],
) -> None:
    fs, snap = ws.fs, ws.snapshot
    assert fs is not None
    assert snap is not None
    assert [e.name for e in await fs.ls("/")] == ["d"]
    assert await fs.glob("**/leaf.txt") == [f"{deep_dir}/leaf.txt"]
    found = await fs.grep(compile_pattern("needle"), corral.provider.GrepOptions())
    assert [m.path for m in found.matches] == [f"{deep_dir}/leaf.txt"]
    assert (await fs.stat("/d")).type == "dir"
    repr(ws)
    info = await snap.snapshot("deep")
    await fs.rm("/d", recursive=True)
    assert await fs.ls("/") == []
    await snap.restore(info.snapshot_id)
    assert [e.name for e in await fs.ls("/")] == ["d"]
    branch_ref = await snap.branch(info.snapshot_id)
    branch = await provider.resolve(branch_ref)
    assert branch.fs is not None
    assert await branch.fs.glob("**/leaf.txt") == [f"{deep_dir}/leaf.txt"]
    await branch.close()
    await ws.close()


async def test_deepest_tree_the_tools_can_build(
    provider: InMemoryProvider,
    config: corral.ProviderConfig,
    session: corral.SessionRef,
    compile_pattern: Callable[..., corral.provider.Matcher],
) -> None:
    opened = await provider.open(config, session)
    fs = opened.workspace.fs
    assert fs is not None
    deep_dir = "/d" * TOOL_DEPTH
    await fs.mkdir(deep_dir, parents=True)
    await fs.write_file(f"{deep_dir}/leaf.txt", b"needle\n")
    await _exercise(provider, opened.workspace, deep_dir, compile_pattern)
    again = await provider.open(config, session)
    await again.workspace.close()


async def test_any_depth_when_built_directly(
    provider: InMemoryProvider,
    config: corral.ProviderConfig,
    session: corral.SessionRef,
    compile_pattern: Callable[..., corral.provider.Matcher],
) -> None:
    opened = await provider.open(config, session)
    state = find(opened.ref.payload["workspace_id"])
    assert state is not None
    node = state.tree.root
    for _ in range(DEPTH):
        child = DirNode({}, 0.0)
        node.children["d"] = child
        node = child
    node.children["leaf.txt"] = FileNode(b"needle\n", 0.0)
    # Paths this long cannot be named by the tools, but walks still see them.
    fs = opened.workspace.fs
    assert fs is not None
    hits = await fs.glob("**/leaf.txt")
    assert len(hits) == 1
    assert hits[0].count("/d") == DEPTH
    snap = opened.workspace.snapshot
    assert snap is not None
    info = await snap.snapshot()
    await fs.rm("/d", recursive=True)
    await snap.restore(info.snapshot_id)
    repr(state)
    await opened.workspace.close()
    again = await provider.open(config, session)
    await again.workspace.close()


async def test_wide_directory(
    provider: InMemoryProvider,
    config: corral.ProviderConfig,
    session: corral.SessionRef,
    compile_pattern: Callable[..., corral.provider.Matcher],
) -> None:
    opened = await provider.open(config, session)
    state = find(opened.ref.payload["workspace_id"])
    assert state is not None
    wide = DirNode({f"f{i}": FileNode(b"x\n", 0.0) for i in range(100_000)}, 0.0)
    state.tree.root.children["wide"] = wide
    fs = opened.workspace.fs
    assert fs is not None
    assert len(await fs.ls("/wide")) == 100_000
    assert len(await fs.glob("wide/*")) == 100_000
    found = await fs.grep(compile_pattern("x"), corral.provider.GrepOptions(max_results=10))
    assert found.truncated
    await fs.rm("/wide", recursive=True)
    await opened.workspace.close()
