"""Versions: snapshots read and compared without restoring them (``corral.provider.Versions``)."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

import pytest

from corral import OperationError, VersionChange, get_regex_engine
from corral.capability import GrepOptions
from corral.provider import CommandRequest, FileSystem, OpenedWorkspace, Versions

from ._fs_machine import diff_trees, observe_tree
from ._harness import Harness, dump_tree
from ._rules import define, rule
from ._strategies import BYTES_EXAMPLES

__all__ = ["AbstractVersionsTests"]

READ_EQUALS_RESTORE = define(
    "snapshot.versions.read_equals_restore",
    "Versions.read_file_at / ls_at / stat_at / grep_at",
    "Reading a version (read_file_at, ls_at, stat_at, grep_at) answers exactly what restoring "
    "that version and reading the live workspace answers, whatever changed since.",
)
EXACT = define(
    "snapshot.versions.restore_exact",
    "Versions (Snapshotter.restore)",
    "Restoring a version brings back exactly its entries after any change in between: "
    "changed, added and removed files, a file replaced by a directory and back, empty "
    "directories, binary content and (where stat reports them) modes.",
)
DIFF = define(
    "snapshot.versions.diff",
    "Versions.diff",
    "diff(a, b) and diff(a) (to the live workspace) list, sorted by path, exactly the entries "
    "added, removed or modified between the two states, one VersionChange per entry with "
    "the type and the sizes before and after; identical states give no change.",
)
BRANCH = define(
    "snapshot.versions.branch_independent",
    "Versions (Snapshotter.branch)",
    "A branch of a version starts as that version and is independent of it: writes to the "
    "branch or the origin never change what the version reads back.",
)
ERRORS = define(
    "snapshot.versions.errors",
    "Versions",
    "Reading a version: an unknown id -> not_found; a missing path -> not_found; a "
    "directory read as a file -> is_a_directory; a file listed as a directory -> "
    "not_a_directory; a file over max_bytes -> too_large (never another version's data).",
)
INTEGRITY = define(
    "snapshot.versions.integrity",
    "Versions (conformance_damage hook)",
    "A version whose stored content of a file is corrupt or missing makes read_file_at and "
    "restore of that version fail with OperationError(code='failed') naming the version and "
    "the path; the damaged content is never written to the workspace, the version's other "
    "files still read, and the workspace keeps working (snapshot, restore of a sound "
    "version). Runs where the snapshot module offers the optional "
    "conformance_damage(snapshot_id, path, how) hook; skipped elsewhere.",
)


def _modules(h: Harness, opened: OpenedWorkspace) -> tuple[FileSystem, Versions]:
    fs, snap = opened.workspace.fs, opened.workspace.snapshot
    assert fs is not None
    if not isinstance(snap, Versions):
        pytest.skip(f"{h.kind}'s snapshot module does not offer corral.provider.Versions")
    return fs, snap


async def _seed(h: Harness, fs: FileSystem) -> None:
    await h.call(fs.mkdir, "/empty/inner", parents=True)
    await h.call(fs.write_file, "/src/app.py", b"print('v1')\nneedle one\n")
    await h.call(fs.write_file, "/src/lib/util.py", b"def f():\n    return 1\n")
    await h.call(fs.write_file, "/docs/empty.txt", b"")
    for idx, data in enumerate(BYTES_EXAMPLES[:4]):
        await h.call(fs.write_file, f"/bin/b{idx}", data)
    await h.call(fs.write_file, "/gone.txt", b"deleted later")


async def _change(h: Harness, fs: FileSystem) -> None:
    await h.call(fs.write_file, "/src/app.py", b"print('v2')\n")
    await h.call(fs.write_file, "/src/new.py", b"new")
    await h.call(fs.rm, "/gone.txt")
    await h.call(fs.rm, "/empty", recursive=True)
    await h.call(fs.rm, "/src/lib", recursive=True)
    await h.call(fs.write_file, "/src/lib", b"now a file")
    await h.call(fs.mkdir, "/docs/empty.txt.d")


class AbstractVersionsTests:
    """Rules for snapshot modules that are :class:`corral.provider.Versions`."""

    @rule(READ_EQUALS_RESTORE)
    @pytest.mark.anyio
    async def test_reading_a_version_equals_restoring_it(self, conformance: Harness) -> None:
        """Every file, listing and stat read at a version matches the restored tree."""
        h = conformance
        h.require("snapshot", "fs")
        async with h.session("fs", "snapshot") as opened:
            fs, snap = _modules(h, opened)
            await _seed(h, fs)
            info = await h.call(snap.snapshot, "v1")
            await _change(h, fs)
            matcher = get_regex_engine().compile("needle|return")
            opts = GrepOptions(path="/")
            at_grep = await h.call(snap.grep_at, info.snapshot_id, matcher, opts)
            at_files = {}
            at_dirs = {}
            stack = ["/"]
            while stack:
                path = stack.pop()
                entries = await h.call(snap.ls_at, info.snapshot_id, path)
                at_dirs[path] = [(e.name, e.type, e.size) for e in entries]
                for e in entries:
                    st = await h.call(snap.stat_at, info.snapshot_id, e.path)
                    assert (st.type, st.size) == (e.type, e.size), f"stat_at {e.path} vs ls_at"
                    if e.type == "dir":
                        stack.append(e.path)
                    elif e.type == "file":
                        at_files[e.path] = (
                            await h.call(snap.read_file_at, info.snapshot_id, e.path),
                            st.mode,
                        )
            await h.call(snap.restore, info.snapshot_id)
            for path, listing in at_dirs.items():
                live = [(e.name, e.type, e.size) for e in await h.call(fs.ls, path)]
                assert live == listing, f"ls_at {path} gave {listing}, restored {live}"
            for path, (data, mode) in at_files.items():
                assert await h.call(fs.read_file, path) == data, f"read_file_at {path} differs"
                assert (await h.call(fs.stat, path)).mode == mode, f"stat_at {path}: mode"
            live_grep = await h.call(fs.grep, matcher, opts)
            assert at_grep == live_grep, f"grep_at gave {at_grep}, restored {live_grep}"
            files = {p: d for p, d in (await h.call(dump_tree, fs)).items() if d is not None}
            assert files == {p: d for p, (d, _m) in at_files.items()}, "files differ"

    @rule(EXACT)
    @pytest.mark.anyio
    async def test_restore_by_difference_is_exact(self, conformance: Harness) -> None:
        """Type changes, removals and additions between versions all come back, both ways."""
        h = conformance
        h.require("snapshot", "fs")
        async with h.session("fs", "snapshot") as opened:
            fs, snap = _modules(h, opened)
            await _seed(h, fs)
            v1_tree = await h.call(observe_tree, fs)
            v1 = await h.call(snap.snapshot, "v1")
            await _change(h, fs)
            v2_tree = await h.call(observe_tree, fs)
            v2 = await h.call(snap.snapshot, "v2")
            for target, want in ((v1, v1_tree), (v2, v2_tree), (v1, v1_tree)):
                await h.call(snap.restore, target.snapshot_id)
                got = await h.call(observe_tree, fs)
                assert got == want, f"restore {target.label}: {diff_trees(got, want)}"

    @rule(EXACT)
    @pytest.mark.anyio
    async def test_restore_by_difference_brings_back_modes(self, conformance: Harness) -> None:
        """A chmod after a version is undone by restoring it (shell providers)."""
        h = conformance
        h.require("snapshot", "fs", "shell")
        async with h.session("fs", "snapshot", "shell") as opened:
            fs, snap = _modules(h, opened)
            shell = opened.workspace.shell
            assert shell is not None
            setup = CommandRequest(
                "mkdir -p d && echo x > d/f && chmod 640 d/f && chmod 750 d",
                allow_shell_syntax=True,
            )
            assert (await h.call(shell.run, setup)).exit_code == 0
            before = {p: (await h.call(fs.stat, p)).mode for p in ("/d", "/d/f")}
            info = await h.call(snap.snapshot, "modes")
            change = CommandRequest("chmod 600 d/f && chmod 700 d", allow_shell_syntax=True)
            assert (await h.call(shell.run, change)).exit_code == 0
            changes = await h.call(snap.diff, info.snapshot_id)
            assert {c.path for c in changes} == {"/d", "/d/f"}, f"diff after chmod: {changes}"
            await h.call(snap.restore, info.snapshot_id)
            after = {p: (await h.call(fs.stat, p)).mode for p in ("/d", "/d/f")}
            assert after == before, f"restore gave modes {after}, the version held {before}"

    @rule(DIFF)
    @pytest.mark.anyio
    async def test_diff_lists_exactly_what_changed(self, conformance: Harness) -> None:
        """diff(v1, v2), diff(v1) and diff(v2) against the live tree."""
        h = conformance
        h.require("snapshot", "fs")
        async with h.session("fs", "snapshot") as opened:
            fs, snap = _modules(h, opened)
            await _seed(h, fs)
            v1 = await h.call(snap.snapshot, "v1")
            assert list(await h.call(snap.diff, v1.snapshot_id)) == [], "no change, yet a diff"
            await _change(h, fs)
            want = [
                VersionChange("/docs/empty.txt.d", "added", "dir", None, 0),
                VersionChange("/empty", "removed", "dir", 0, None),
                VersionChange("/empty/inner", "removed", "dir", 0, None),
                VersionChange("/gone.txt", "removed", "file", 13, None),
                VersionChange("/src/app.py", "modified", "file", 23, 12),
                VersionChange("/src/lib", "modified", "file", 0, 10),
                VersionChange("/src/lib/util.py", "removed", "file", 22, None),
                VersionChange("/src/new.py", "added", "file", None, 3),
            ]
            got = list(await h.call(snap.diff, v1.snapshot_id))
            assert got == want, f"diff(v1, live) gave {got}, expected {want}"
            v2 = await h.call(snap.snapshot, "v2")
            got = list(await h.call(snap.diff, v1.snapshot_id, v2.snapshot_id))
            assert got == want, f"diff(v1, v2) gave {got}, expected {want}"
            assert list(await h.call(snap.diff, v2.snapshot_id, v2.snapshot_id)) == []
            back = list(await h.call(snap.diff, v2.snapshot_id, v1.snapshot_id))
            assert [c.path for c in back] == [c.path for c in want], "diff(v2, v1) paths"
            flipped = {"added": "removed", "removed": "added", "modified": "modified"}
            assert [c.change for c in back] == [flipped[c.change] for c in want]

    @rule(BRANCH)
    @pytest.mark.anyio
    async def test_branch_and_origin_never_change_the_version(self, conformance: Harness) -> None:
        """A branch starts as the version; later writes anywhere leave the version as it was."""
        h = conformance
        h.require("snapshot", "fs")
        async with h.session("fs", "snapshot") as opened:
            fs, snap = _modules(h, opened)
            await _seed(h, fs)
            expected = await h.call(dump_tree, fs)
            info = await h.call(snap.snapshot, "base")
            ref = await h.call(snap.branch, info.snapshot_id)
            branch = await h.call(h.provider.resolve, ref)
            try:
                assert branch.fs is not None
                assert await h.call(dump_tree, branch.fs) == expected, "branch differs"
                await h.call(branch.fs.write_file, "/src/app.py", b"branch edit")
                await h.call(fs.write_file, "/src/app.py", b"origin edit")
                assert (
                    await h.call(snap.read_file_at, info.snapshot_id, "/src/app.py")
                    == (expected["/src/app.py"])
                ), "a write changed the stored version"
                assert await h.call(branch.fs.read_file, "/src/app.py") == b"branch edit"
                assert await h.call(fs.read_file, "/src/app.py") == b"origin edit"
            finally:
                await h.call(branch.close)

    @rule(ERRORS)
    @pytest.mark.anyio
    async def test_reading_versions_reports_errors(self, conformance: Harness) -> None:
        """Unknown ids and paths, wrong types and caps give the fs error codes."""
        h = conformance
        h.require("snapshot", "fs")
        async with h.session("fs", "snapshot") as opened:
            fs, snap = _modules(h, opened)
            await _seed(h, fs)
            info = await h.call(snap.snapshot, None)
            sid = info.snapshot_id
            cases: list[tuple[str, Callable[..., Awaitable[object]], tuple[str, ...]]] = [
                ("not_found", snap.read_file_at, ("snap-unknown", "/src/app.py")),
                ("not_found", snap.ls_at, ("snap-unknown", "/")),
                ("not_found", snap.diff, ("snap-unknown",)),
                ("not_found", snap.read_file_at, (sid, "/nope")),
                ("not_found", snap.stat_at, (sid, "/src/nope")),
                ("is_a_directory", snap.read_file_at, (sid, "/src")),
                ("not_a_directory", snap.ls_at, (sid, "/src/app.py")),
            ]
            for code, op, args in cases:
                with pytest.raises(OperationError) as caught:
                    await h.call(op, *args)
                assert caught.value.code == code, f"{op.__name__}{args}: {caught.value.code!r}"
            with pytest.raises(OperationError) as caught:
                await h.call(snap.read_file_at, sid, "/src/app.py", max_bytes=3)
            assert caught.value.code == "too_large", f"max_bytes: {caught.value.code!r}"
            assert await h.call(snap.read_file_at, sid, "/docs/empty.txt") == b""

    @rule(INTEGRITY)
    @pytest.mark.anyio
    async def test_damaged_versions_fail_cleanly(self, conformance: Harness) -> None:
        """Corrupt and missing stored content: named errors, nothing garbage restored."""
        h = conformance
        h.require("snapshot", "fs")
        async with h.session("fs", "snapshot") as opened:
            fs, snap = _modules(h, opened)
            damage = getattr(snap, "conformance_damage", None)
            if damage is None:
                pytest.skip(f"{h.kind}'s snapshot module offers no conformance_damage hook")
            await h.call(fs.write_file, "/keep.txt", b"kept intact\n")
            for how in ("corrupt", "missing"):
                # Unique content: a blob shared with another run's version is not this test's.
                content = f"the {how} version's own content {secrets.token_hex(8)}\n".encode()
                await h.call(fs.write_file, "/victim.txt", content)
                info = await h.call(snap.snapshot, how)
                await h.call(fs.write_file, "/victim.txt", b"live edit\n")
                await h.call(damage, info.snapshot_id, "/victim.txt", how)
                ops: list[tuple[Callable[..., Awaitable[object]], tuple[str, ...]]] = [
                    (snap.read_file_at, (info.snapshot_id, "/victim.txt")),
                    (snap.restore, (info.snapshot_id,)),
                ]
                for op, args in ops:
                    failure: OperationError | None = None
                    try:
                        await h.call(op, *args)
                    except OperationError as exc:
                        failure = exc
                    what = f"{op.__name__} of a version with {how} content"
                    assert failure is not None, f"{what} succeeded"
                    assert failure.code == "failed", f"{what}: {failure!r}"
                    assert info.snapshot_id in str(failure), f"{what}: no version named"
                    assert "/victim.txt" in str(failure), f"{what}: no path named"
                live = await h.call(fs.read_file, "/victim.txt")
                assert live in (b"live edit\n", content), f"{how}: restore wrote {live!r}"
                kept = await h.call(snap.read_file_at, info.snapshot_id, "/keep.txt")
                assert kept == b"kept intact\n", f"{how}: a sound file of the version"
                after = await h.call(snap.snapshot, f"{how}, after")
                await h.call(fs.write_file, "/victim.txt", b"again\n")
                await h.call(snap.restore, after.snapshot_id)
                assert await h.call(fs.read_file, "/victim.txt") == live, f"{how}: unusable"
