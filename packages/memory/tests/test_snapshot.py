"""Snapshots: snapshot, restore, list, delete, branch."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

import corral
import corral.provider
from corral_memory import InMemoryProvider

pytestmark = pytest.mark.anyio

TreeOf = Callable[[corral.provider.FileSystem], Awaitable[dict[str, bytes | None]]]


async def _code(awaitable: object) -> str:
    with pytest.raises(corral.OperationError) as info:
        await awaitable  # type: ignore[misc]
    return info.value.code


async def _seed(fs: corral.provider.FileSystem) -> None:
    await fs.write_file("/a/one.txt", b"1")
    await fs.write_file("/a/b/two.txt", b"22")
    await fs.mkdir("/empty")


async def test_restore_brings_back_exactly_the_snapshot(
    opened: corral.provider.OpenedWorkspace,
    fs: corral.provider.FileSystem,
    snap: corral.provider.Snapshotter,
    tree_of: TreeOf,
) -> None:
    await _seed(fs)
    before = await tree_of(fs)
    info = await snap.snapshot("seeded")
    await fs.write_file("/a/one.txt", b"changed")
    await fs.rm("/a/b", recursive=True)
    await fs.mkdir("/new")
    await fs.write_file("/new/file", b"x")
    assert await tree_of(fs) != before
    ref = await snap.restore(info.snapshot_id)
    assert ref == opened.ref
    assert await tree_of(fs) == before
    # The snapshot is untouched by writes made after a restore.
    await fs.write_file("/a/one.txt", b"again")
    await snap.restore(info.snapshot_id)
    assert await tree_of(fs) == before


async def test_restore_restores_budget_counters(
    opened: corral.provider.OpenedWorkspace,
    fs: corral.provider.FileSystem,
    snap: corral.provider.Snapshotter,
) -> None:
    await _seed(fs)
    details = corral.provider.describe_workspace(opened.workspace)
    info = await snap.snapshot()
    await fs.write_file("/big", b"x" * 5000)
    await snap.restore(info.snapshot_id)
    after = corral.provider.describe_workspace(opened.workspace)
    assert (after["used_bytes"], after["file_bytes"]) == (
        details["used_bytes"],
        details["file_bytes"],
    )


async def test_list_delete_and_info(
    fs: corral.provider.FileSystem, snap: corral.provider.Snapshotter
) -> None:
    assert await snap.list() == []
    await fs.write_file("/f", b"12345")
    first = await snap.snapshot("first")
    await fs.write_file("/g", b"67")
    second = await snap.snapshot()
    assert (first.label, first.size_bytes) == ("first", 5)
    assert (second.label, second.size_bytes) == (None, 7)
    assert first.snapshot_id != second.snapshot_id
    assert second.created_at >= first.created_at
    assert await snap.list() == [first, second]
    await snap.delete(first.snapshot_id)
    assert await snap.list() == [second]
    assert await _code(snap.delete(first.snapshot_id)) == "not_found"
    assert await _code(snap.restore(first.snapshot_id)) == "not_found"
    assert await _code(snap.branch(first.snapshot_id)) == "not_found"


async def test_bad_arguments(snap: corral.provider.Snapshotter) -> None:
    assert await _code(snap.snapshot("x" * 201)) == "invalid_argument"
    assert await _code(snap.snapshot(5)) == "invalid_argument"  # type: ignore[arg-type]
    assert await _code(snap.restore("")) == "invalid_argument"
    assert await _code(snap.delete(None)) == "invalid_argument"  # type: ignore[arg-type]
    with pytest.raises(corral.OperationError) as info:
        await snap.restore("\x1b[31m" + "y" * 100)
    assert "y" * 100 not in info.value.message
    assert "\x1b" not in info.value.message


async def test_branch_is_a_separate_workspace(
    opened: corral.provider.OpenedWorkspace,
    fs: corral.provider.FileSystem,
    snap: corral.provider.Snapshotter,
    tree_of: TreeOf,
) -> None:
    await _seed(fs)
    seeded = await tree_of(fs)
    info = await snap.snapshot()
    await fs.write_file("/after-snapshot", b"x")
    ref = await snap.branch(info.snapshot_id)
    assert ref.provider_id == "in-memory"
    assert ref.schema_version == 2
    assert ref.capabilities == opened.ref.capabilities
    assert ref.payload["workspace_id"] != opened.ref.payload["workspace_id"]
    branch = await InMemoryProvider().resolve(ref)
    assert branch.id != opened.workspace.id
    assert branch.fs is not None
    assert branch.snapshot is not None
    assert await tree_of(branch.fs) == seeded
    assert await branch.snapshot.list() == []
    await branch.fs.write_file("/a/one.txt", b"branch")
    assert await fs.read_file("/a/one.txt") == b"1"
    await fs.write_file("/a/b/two.txt", b"source")
    assert await branch.fs.read_file("/a/b/two.txt") == b"22"
    await branch.close()
    assert await fs.read_file("/a/one.txt") == b"1"
    with pytest.raises(corral.WorkspaceFailedError):
        await InMemoryProvider().resolve(ref)


async def test_snapshot_count_is_bounded(config: corral.ProviderConfig, anyio_backend: str) -> None:
    opened = await InMemoryProvider(max_snapshots=2).open(config, corral.SessionRef("s"))
    snap = opened.workspace.snapshot
    assert snap is not None
    first = await snap.snapshot()
    await snap.snapshot()
    assert await _code(snap.snapshot()) == "too_large"
    await snap.delete(first.snapshot_id)
    await snap.snapshot()
    assert len(await snap.list()) == 2
    await opened.workspace.close()


async def test_close_drops_snapshots(
    opened: corral.provider.OpenedWorkspace,
    fs: corral.provider.FileSystem,
    snap: corral.provider.Snapshotter,
) -> None:
    await _seed(fs)
    info = await snap.snapshot()
    branch_ref = await snap.branch(info.snapshot_id)
    await opened.workspace.close()
    assert await _code(snap.list()) == "closed"
    with pytest.raises(corral.WorkspaceFailedError):
        await InMemoryProvider().resolve(opened.ref)
    # A branch outlives its source: it is a workspace of its own.
    branch = await InMemoryProvider().resolve(branch_ref)
    assert branch.fs is not None
    assert await branch.fs.read_file("/a/one.txt") == b"1"
    await branch.close()
