"""Snapshots through the workspace: restore keeps the ref and reattaches; branch is separate."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.provider import CommandRequest, OperationError, ProviderConfig, SessionRef
from corral_local_bash import LocalBashProvider

CONFIG = ProviderConfig(kind="local-bash")


@pytest.mark.anyio
async def test_restore_and_branch_through_the_workspace(provider: LocalBashProvider) -> None:
    opened = await provider.open(CONFIG, SessionRef("snap"))
    ws, ref = opened.workspace, opened.ref
    assert ws.fs is not None
    assert ws.snapshot is not None
    await ws.fs.write_file("/a.txt", b"v1")
    await ws.fs.mkdir("/empty")
    info = await ws.snapshot.snapshot("v1")
    await ws.fs.write_file("/a.txt", b"v2")
    await ws.fs.rm("/empty")
    await ws.fs.write_file("/b.txt", b"new")

    assert await ws.snapshot.restore(info.snapshot_id) == ref
    # The filesystem follows the swapped-in directory without re-resolving.
    assert await ws.fs.read_file("/a.txt") == b"v1"
    assert [(e.name, e.type) for e in await ws.fs.ls("/")] == [("a.txt", "file"), ("empty", "dir")]
    assert ws.shell is not None
    result = await ws.shell.run(CommandRequest("cat a.txt"))
    assert result.stdout == "v1"

    branch_ref = await ws.snapshot.branch(info.snapshot_id)
    assert branch_ref.provider_id == "local-bash"
    assert branch_ref.capabilities == ref.capabilities
    assert branch_ref.payload["workspace"] != ref.payload["workspace"]
    other = LocalBashProvider(tmpdir_root=provider.layout.tmpdir_root)
    branch = await other.resolve(branch_ref)
    assert branch.fs is not None
    assert branch.snapshot is not None
    assert await branch.snapshot.list() == []
    await branch.fs.write_file("/a.txt", b"branch")
    assert await ws.fs.read_file("/a.txt") == b"v1"

    snap_dir = provider.layout.snapshot_path(ref.payload["workspace"])
    assert os.listdir(snap_dir)
    await ws.close()
    assert not Path(snap_dir).exists()
    assert await branch.fs.read_file("/a.txt") == b"branch"  # the branch outlives its source
    await branch.close()


@pytest.mark.anyio
async def test_restore_after_close_is_refused(provider: LocalBashProvider) -> None:
    opened = await provider.open(CONFIG, SessionRef("snap"), frozenset({"snapshot"}))
    snap = opened.workspace.snapshot
    assert snap is not None
    info = await snap.snapshot()
    await opened.workspace.close()
    with pytest.raises(OperationError) as closed:
        await snap.restore(info.snapshot_id)
    assert closed.value.code == "closed"
