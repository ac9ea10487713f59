"""Rule 9: snapshots (where advertised)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral import FileSystem, OpenedWorkspace, OperationError, Snapshotter, WorkspaceFailedError

from ._harness import Harness, dump_tree
from ._strategies import contents, paths

__all__ = ["AbstractSnapshotTests"]

_edits = st.lists(
    st.tuples(st.sampled_from(("write", "rm", "mkdir")), paths(max_depth=2), contents), max_size=6
)


async def _apply(h: Harness, fs: FileSystem, edits: list[tuple[str, str, bytes]]) -> None:
    for op, path, data in edits:
        try:
            if op == "write":
                await h.call(fs.write_file, path, data)
            elif op == "rm":
                await h.call(fs.rm, path, recursive=True)
            else:
                await h.call(fs.mkdir, path, parents=True)
        except OperationError:
            pass  # clashes (a file where a directory should be) are part of the game


def _modules(opened: OpenedWorkspace) -> tuple[FileSystem, Snapshotter]:
    fs, snap = opened.workspace.fs, opened.workspace.snapshot
    assert fs is not None
    assert snap is not None
    return fs, snap


class AbstractSnapshotTests:
    """Rule 9 for providers that advertise ``snapshot`` (with ``fs`` to observe it)."""

    @pytest.mark.anyio
    async def test_restore_brings_back_snapshot_state(self, conformance: Harness) -> None:
        """After any edits, restore shows exactly the files of the snapshot."""
        h = conformance
        h.require("snapshot", "fs")

        @h.settings(max_examples=max(5, h.max_examples // 3))
        @given(_edits, _edits)
        def edits(
            before: list[tuple[str, str, bytes]], after: list[tuple[str, str, bytes]]
        ) -> None:
            h.blocking(self._restore_round, h, before, after)

        await h.in_thread(edits)

    async def _restore_round(
        self, h: Harness, before: list[tuple[str, str, bytes]], after: list[tuple[str, str, bytes]]
    ) -> None:
        async with h.session("fs", "snapshot") as opened:
            fs, snap = _modules(opened)
            await _apply(h, fs, before)
            expected = await h.call(dump_tree, fs)
            info = await h.call(snap.snapshot, "before")
            await _apply(h, fs, [*after, ("write", "/after-snapshot.txt", b"later")])
            ref = await h.call(snap.restore, info.snapshot_id)
            assert ref.provider_id == h.kind, "restore returned a ref of another provider"
            restored = await h.call(h.provider.resolve, ref)
            try:
                assert restored.fs is not None, "the restored workspace has no fs module"
                got = await h.call(dump_tree, restored.fs)
                assert got == expected, f"restore gave {got!r}, the snapshot held {expected!r}"
                if ref == opened.ref:
                    assert await h.call(dump_tree, fs) == expected, (
                        "restore in place left other files"
                    )
            finally:
                if ref != opened.ref:
                    await h.call(restored.close)

    @pytest.mark.anyio
    async def test_branch_is_a_separate_workspace(self, conformance: Harness) -> None:
        """A branch starts from the snapshot and then lives apart from its origin."""
        h = conformance
        h.require("snapshot", "fs")
        async with h.session("fs", "snapshot") as opened:
            fs, snap = _modules(opened)
            await h.call(fs.write_file, "/shared.txt", b"seed")
            info = await h.call(snap.snapshot, "seed")
            await h.call(fs.write_file, "/origin-later.txt", b"origin")
            ref = await h.call(snap.branch, info.snapshot_id)
            assert ref.provider_id == h.kind, "branch returned a ref of another provider"
            assert ref != opened.ref, "branch returned the origin's own ref"
            branch = await h.call(h.provider.resolve, ref)
            try:
                assert branch.fs is not None, "the branch has no fs module"
                assert await h.call(dump_tree, branch.fs) == {"/shared.txt": b"seed"}, (
                    "the branch does not start from the snapshot"
                )
                await h.call(branch.fs.write_file, "/branch-only.txt", b"branch")
                await h.call(branch.fs.write_file, "/shared.txt", b"changed in branch")
                assert await h.call(dump_tree, fs) == {
                    "/shared.txt": b"seed",
                    "/origin-later.txt": b"origin",
                }, "writes to the branch show in the origin"
                await h.call(fs.rm, "/shared.txt")
                assert await h.call(branch.fs.read_file, "/shared.txt") == b"changed in branch", (
                    "writes to the origin show in the branch"
                )
            finally:
                await h.call(branch.close)

    @pytest.mark.anyio
    async def test_delete_removes_snapshot(self, conformance: Harness) -> None:
        """List is oldest first; delete removes a snapshot for good."""
        h = conformance
        h.require("snapshot")
        async with h.session("snapshot") as opened:
            snap = opened.workspace.snapshot
            assert snap is not None
            first = await h.call(snap.snapshot, "first")
            second = await h.call(snap.snapshot, "second")
            ids = [s.snapshot_id for s in await h.call(snap.list)]
            assert ids == [first.snapshot_id, second.snapshot_id], (
                f"list gave {ids}, oldest first expected"
            )
            await h.call(snap.delete, first.snapshot_id)
            ids = [s.snapshot_id for s in await h.call(snap.list)]
            assert ids == [second.snapshot_id], f"after delete, list gave {ids}"
            for op in (snap.restore, snap.delete, snap.branch):
                with pytest.raises(OperationError) as caught:
                    await h.call(op, first.snapshot_id)
                assert caught.value.code == "not_found", (
                    f"deleted snapshot: code {caught.value.code!r}"
                )

    @pytest.mark.anyio
    async def test_unknown_snapshot_is_not_found(self, conformance: Harness) -> None:
        """An id the workspace never made is ``not_found``, never another workspace's state."""
        h = conformance
        h.require("snapshot")
        async with h.session("snapshot") as opened:
            snap = opened.workspace.snapshot
            assert snap is not None
            for op in (snap.restore, snap.delete, snap.branch):
                try:
                    with pytest.raises(OperationError) as caught:
                        await h.call(op, "no-such-snapshot")
                except WorkspaceFailedError as exc:
                    raise AssertionError(f"unknown snapshot failed the workspace: {exc}") from exc
                assert caught.value.code == "not_found", (
                    f"unknown snapshot: code {caught.value.code!r}"
                )
