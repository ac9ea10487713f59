"""Deep trees (issue 11, item 8) and the here-document allowlist bypass (item 9)
against the real docker provider."""

from __future__ import annotations

import os
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest

import corral
import corral.provider
from corral_docker import DockerProvider
from corral_posix import remove_tree

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

T = TypeVar("T")

# -- the scenario (kept in step across providers; tests cannot import each other) --

_CHUNK = "/".join(["d"] * 1_000)
# Shells cd by absolute path (dash, busybox), so no shell can cd 10,000
# levels down. Instead: a 1,000-level chain, wrapped nine times into a fresh
# chain by rename. No path ever nears PATH_MAX, yet the tree ends about
# 10,000 levels deep, as one agent command can make it.
BUILD = (
    f"mkdir -p d/{_CHUNK} && echo needle > d/{_CHUNK}/leaf.txt && "
    f"for i in 1 2 3 4 5 6 7 8 9; do mkdir -p t/{_CHUNK} && mv d t/{_CHUNK}/ && mv t d "
    "|| exit 1; done"
)


async def _clean(awaitable: Awaitable[T]) -> T | None:
    """Run one operation: it may work or fail with a clean OperationError, nothing else."""
    try:
        return await awaitable
    except corral.OperationError:
        return None


async def build_deep(ws: corral.provider.Workspace) -> None:
    assert ws.shell is not None
    result = await ws.shell.run(
        corral.provider.CommandRequest(BUILD, allow_shell_syntax=True, timeout_s=300)
    )
    assert result.exit_code == 0, result.stderr


async def deep_tree_scenario(provider: Any, config: corral.ProviderConfig) -> None:
    """Issue 11, item 8 against the real provider (local engine, bind-mounted
    workspace): every tool on a 10,000-level tree works or fails cleanly,
    close leaves no trash, and opens keep working."""
    opened = await provider.open(config, corral.SessionRef("deep"))
    ws = opened.workspace
    fs, snap = ws.fs, ws.snapshot
    assert fs is not None
    assert snap is not None
    await fs.write_file("/small.txt", b"small\n")
    small = await snap.snapshot("small")
    await build_deep(ws)
    assert {e.name for e in await fs.ls("/")} == {"d", "small.txt"}
    assert (await fs.stat("/d")).type == "dir"
    await _clean(fs.glob("**/leaf.txt"))
    await _clean(
        fs.grep(corral.RegexModuleEngine().compile("needle"), corral.provider.GrepOptions())
    )
    deep = await snap.snapshot("deep")  # a 10,000-level tree is a version like any other
    assert isinstance(snap, corral.provider.Versions)
    found = await snap.grep_at(
        deep.snapshot_id,
        corral.RegexModuleEngine().compile("needle"),
        corral.provider.GrepOptions(),
    )
    assert [m.line for m in found.matches] == ["needle"]
    await snap.restore(small.snapshot_id)  # by difference: the deep tree is removed
    assert [e.name for e in await fs.ls("/")] == ["small.txt"]
    await snap.restore(deep.snapshot_id)  # and brought back, 10,000 levels of it
    assert {e.name for e in await fs.ls("/")} == {"d", "small.txt"}
    # ... owned by the container user, who can write into it again.
    assert ws.shell is not None
    touched = await ws.shell.run(corral.provider.CommandRequest("touch d/d/mine"))
    assert touched.exit_code == 0, touched.stderr
    branch = await provider.resolve(await snap.branch(deep.snapshot_id))
    assert branch.fs is not None
    assert {e.name for e in await branch.fs.ls("/")} == {"d", "small.txt"}
    await branch.close()
    await build_deep(ws)
    await fs.rm("/d", recursive=True)
    assert [e.name for e in await fs.ls("/")] == ["small.txt"]
    await build_deep(ws)
    await ws.close()
    base = provider.layout.base_dir
    leftovers = [n for n in os.listdir(base) if n.startswith((".trash-", ".tmp-", ".stuck-"))]
    assert leftovers == []
    assert not os.path.exists(provider.layout.workspace_path(opened.ref.payload["workspace"]))
    again = await provider.open(config, corral.SessionRef("after"))
    await again.workspace.close()


async def heredoc_bypass_is_refused(ws: corral.provider.Workspace) -> None:
    """Issue 11, item 9, the exact reproduction: ``touch S1`` must not run."""
    assert ws.shell is not None
    assert ws.fs is not None
    request = corral.provider.CommandRequest(
        'ls <<"A B"\nA B\ntouch S1',
        allowed_commands=frozenset({"ls", "echo"}),
        allow_shell_syntax=True,
    )
    with pytest.raises(corral.OperationError) as info:
        await ws.shell.run(request)
    assert info.value.code == "policy_denied"
    with pytest.raises(corral.OperationError) as missing:
        await ws.fs.stat("/S1")
    assert missing.value.code == "not_found"


async def test_deep_tree(docker_ready: None, image: str, tmp_root: str) -> None:
    provider = DockerProvider(image=image, tmpdir_root=tmp_root)
    try:
        await deep_tree_scenario(provider, corral.ProviderConfig("docker"))
    finally:
        await provider.aclose()
        remove_tree(tmp_root)  # pytest's own cleanup would recurse on a failure's leftovers


async def test_heredoc_delimiter_with_a_blank_cannot_smuggle_a_command(
    docker_ready: None, image: str, tmp_root: str
) -> None:
    provider = DockerProvider(image=image, tmpdir_root=tmp_root)
    opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("h"))
    try:
        await heredoc_bypass_is_refused(opened.workspace)
    finally:
        await opened.workspace.close()
        await provider.aclose()
