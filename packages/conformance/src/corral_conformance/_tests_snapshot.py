"""Rule 9: snapshots (where advertised)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral import OperationError, WorkspaceFailedError
from corral.provider import CommandRequest, FileSystem, OpenedWorkspace, Snapshotter

from ._fs_machine import diff_trees, observe_tree
from ._harness import Harness, dump_tree
from ._rules import define, rule
from ._strategies import BYTES_EXAMPLES, contents, paths

__all__ = ["AbstractSnapshotTests"]

_SN = "Snapshotter"
RESTORE_EXACT = define(
    "snapshot.restore.exact",
    "Snapshotter.restore",
    "restore brings back exactly the snapshot's state: what was created after is gone, what "
    "was deleted comes back, with empty files and directories, binary content, nested trees "
    "and (where stat reports them) permission modes.",
)
RESTORE_REF = define(
    "snapshot.restore.ref",
    "Snapshotter.restore",
    "restore returns the workspace's (new) ref, of this provider, which resolves to the "
    "restored state.",
)
RESTORE_REPEAT = define(
    "snapshot.restore.repeatable",
    "Snapshotter.restore",
    "A snapshot is a point-in-time copy: writes after it (or after restoring it) never change "
    "it, restoring it twice gives the same state, and restore leaves the snapshot list as it "
    "was.",
)
LIST_ORDER = define(
    "snapshot.list.order",
    "Snapshotter.list",
    "list gives the snapshots of this workspace oldest first, i.e. in the order they were "
    "taken, each as snapshot() described it (id, label, created_at).",
)
INFO = define(
    "snapshot.info.fields",
    "Snapshotter.snapshot / corral._data.SnapshotInfo",
    "snapshot describes the snapshot: a non-empty id unique among this provider's snapshots, "
    "the label exactly as given (or None), created_at in seconds since the epoch, not before "
    "the previous snapshot's.",
)
BRANCH = define(
    "snapshot.branch.separate",
    "Snapshotter.branch",
    "branch creates a separate workspace seeded from a snapshot and returns its ref: writes "
    "to either never show in the other.",
)
DELETE = define(
    "snapshot.delete.semantics",
    "Snapshotter.delete",
    "delete removes exactly that snapshot: it is no longer listed, and restore, branch or a "
    "second delete of it is OperationError(code='not_found'); the others stay.",
)
UNKNOWN = define(
    "snapshot.unknown.not_found",
    "Snapshotter.delete",
    "An unknown id (also another workspace's id) -> OperationError(code='not_found'), never "
    "another workspace's state and never a failed workspace.",
)

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

    @rule(RESTORE_EXACT, RESTORE_REF)
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

    @rule(BRANCH)
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

    @rule(DELETE, LIST_ORDER)
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

    @rule(UNKNOWN)
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

    @rule(RESTORE_EXACT, RESTORE_REF, RESTORE_REPEAT)
    @pytest.mark.anyio
    async def test_restore_is_exact_and_repeatable(self, conformance: Harness) -> None:
        """Nested, empty, binary content comes back exactly, twice; the list is untouched."""
        h = conformance
        h.require("snapshot", "fs")
        async with h.session("fs", "snapshot") as opened:
            fs, snap = _modules(opened)
            await h.call(fs.mkdir, "/empty/inner", parents=True)
            await h.call(fs.write_file, "/d/e/empty.txt", b"")
            for idx, data in enumerate(BYTES_EXAMPLES):
                await h.call(fs.write_file, f"/d/bin{idx}", data)
            await h.call(fs.write_file, "/d/doomed.txt", b"deleted after the snapshot")
            expected = await h.call(observe_tree, fs)
            info = await h.call(snap.snapshot, "exact")
            listed = [s.snapshot_id for s in await h.call(snap.list)]
            await h.call(fs.write_file, "/d/bin1", b"changed")
            await h.call(fs.write_file, "/d/e/new.txt", b"new in a nested dir")
            await h.call(fs.rm, "/d/doomed.txt")
            await h.call(fs.rm, "/empty", recursive=True)
            await h.call(fs.mkdir, "/later-dir")
            for round_ in (1, 2):
                ref = await h.call(snap.restore, info.snapshot_id)
                assert ref.provider_id == h.kind, "restore returned a ref of another provider"
                restored = await h.call(h.provider.resolve, ref)
                try:
                    assert restored.fs is not None, "the restored workspace has no fs module"
                    got = await h.call(observe_tree, restored.fs)
                    assert got == expected, (
                        f"restore #{round_} differs from the snapshot: {diff_trees(got, expected)}"
                    )
                    live = opened.workspace.fs if ref == opened.ref else restored.fs
                    assert live is not None
                    # Writes after a restore must not reach into the stored snapshot.
                    await h.call(live.write_file, "/d/e/empty.txt", b"filled after restore")
                    await h.call(live.write_file, "/empty/inner/x", b"x")
                finally:
                    if ref != opened.ref:
                        await h.call(restored.close)
            after = [s.snapshot_id for s in await h.call(snap.list)]
            assert after == listed, f"restore changed the snapshot list from {listed} to {after}"

    @rule(LIST_ORDER, INFO)
    @pytest.mark.anyio
    async def test_list_is_creation_order_with_labels(self, conformance: Harness) -> None:
        """Snapshots taken back to back are listed in that order with their labels."""
        h = conformance
        h.require("snapshot")
        async with h.session("snapshot") as opened:
            snap = opened.workspace.snapshot
            assert snap is not None
            labels = ["zeta", None, "alpha", "日本 é", "", "zeta", "b" * 100, "m"]
            made = []
            for label in labels:
                info = await h.call(snap.snapshot, label)
                assert isinstance(info.snapshot_id, str), "snapshot id is not a string"
                assert info.snapshot_id, (
                    f"snapshot id {info.snapshot_id!r} is not a non-empty string"
                )
                assert info.label == label, f"label {label!r} came back as {info.label!r}"
                made.append(info)
            ids = [i.snapshot_id for i in made]
            assert len(set(ids)) == len(ids), f"snapshot ids repeat: {ids}"
            stamps = [i.created_at for i in made]
            assert stamps == sorted(stamps), f"created_at goes backwards: {stamps}"
            assert all(1e9 < t < 1e11 for t in stamps), (
                f"created_at is not seconds since the epoch: {stamps}"
            )
            listed = await h.call(snap.list)
            got = [(i.snapshot_id, i.label) for i in listed]
            want = [(i.snapshot_id, i.label) for i in made]
            assert got == want, f"list gave {got}, expected creation order {want}"
            for mine, theirs in zip(listed, made, strict=True):
                assert mine.created_at == theirs.created_at, (
                    f"list reports created_at {mine.created_at} for a snapshot made at "
                    f"{theirs.created_at}"
                )

    @rule(DELETE, LIST_ORDER)
    @pytest.mark.anyio
    async def test_delete_removes_exactly_one(self, conformance: Harness) -> None:
        """Deleting the middle snapshot keeps the others, in order; deleting twice is not_found."""
        h = conformance
        h.require("snapshot")
        async with h.session("snapshot") as opened:
            snap = opened.workspace.snapshot
            assert snap is not None
            made = [await h.call(snap.snapshot, f"s{i}") for i in range(4)]
            await h.call(snap.delete, made[1].snapshot_id)
            await h.call(snap.delete, made[3].snapshot_id)
            ids = [s.snapshot_id for s in await h.call(snap.list)]
            want = [made[0].snapshot_id, made[2].snapshot_id]
            assert ids == want, f"after deleting the 2nd and 4th, list gave {ids}, wanted {want}"
            for op in (snap.delete, snap.restore, snap.branch):
                with pytest.raises(OperationError) as caught:
                    await h.call(op, made[1].snapshot_id)
                assert caught.value.code == "not_found", (
                    f"{op.__name__} of a deleted snapshot: code {caught.value.code!r}"
                )
            if "fs" in h.advertised:
                await h.call(snap.restore, made[2].snapshot_id)

    @rule(UNKNOWN, INFO)
    @pytest.mark.anyio
    async def test_snapshot_ids_are_scoped_to_their_workspace(self, conformance: Harness) -> None:
        """Another workspace's snapshot id is not_found here; ids never repeat across them."""
        h = conformance
        h.require("snapshot", "fs")
        async with h.session("fs", "snapshot") as a, h.session("fs", "snapshot") as b:
            fs_a, snap_a = _modules(a)
            fs_b, snap_b = _modules(b)
            await h.call(fs_a.write_file, "/secret-a.txt", b"a")
            info_a = await h.call(snap_a.snapshot, "a")
            info_b = await h.call(snap_b.snapshot, "b")
            assert info_a.snapshot_id != info_b.snapshot_id, "two workspaces got the same id"
            assert [s.snapshot_id for s in await h.call(snap_b.list)] == [info_b.snapshot_id], (
                "another workspace's snapshot is listed"
            )
            for op in (snap_b.restore, snap_b.branch, snap_b.delete):
                with pytest.raises(OperationError) as caught:
                    await h.call(op, info_a.snapshot_id)
                assert caught.value.code == "not_found", (
                    f"{op.__name__} of another workspace's snapshot: code {caught.value.code!r}"
                )
            assert await h.call(dump_tree, fs_b) == {}, "another workspace's files appeared"
            assert [s.snapshot_id for s in await h.call(snap_a.list)] == [info_a.snapshot_id], (
                "a workspace's snapshot was deleted from another workspace"
            )

    @rule(RESTORE_EXACT)
    @pytest.mark.anyio
    async def test_restore_brings_back_modes(self, conformance: Harness) -> None:
        """Permission modes changed after a snapshot come back (shell providers)."""
        h = conformance
        h.require("snapshot", "fs", "shell")
        async with h.session("fs", "snapshot", "shell") as opened:
            fs, snap = _modules(opened)
            shell = opened.workspace.shell
            assert shell is not None
            setup = await h.call(
                shell.run,
                CommandRequest(
                    "mkdir -p d && echo x > d/run.sh && chmod 750 d/run.sh && chmod 700 d",
                    allow_shell_syntax=True,
                ),
            )
            assert setup.exit_code == 0, f"setup failed: {setup!r}"
            before = {p: (await h.call(fs.stat, p)).mode for p in ("/d", "/d/run.sh")}
            info = await h.call(snap.snapshot, "modes")
            change = await h.call(
                shell.run,
                CommandRequest("chmod 600 d/run.sh && chmod 755 d", allow_shell_syntax=True),
            )
            assert change.exit_code == 0, f"chmod failed: {change!r}"
            await h.call(snap.restore, info.snapshot_id)
            after = {p: (await h.call(fs.stat, p)).mode for p in ("/d", "/d/run.sh")}
            assert after == before, f"restore gave modes {after}, the snapshot held {before}"
