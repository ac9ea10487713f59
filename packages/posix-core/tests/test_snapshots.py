"""The tarball snapshot store: exactness, ordering, delete, restore swap, branch."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import attrs
import pytest

from corral.provider import OperationError, WorkspaceEvictedError, WorkspaceRef
from corral_posix import TmpdirLayout, TmpdirSnapshotter
from corral_posix._manifest import decode

Tree = dict[str, tuple[Any, ...]]


def capture(root: str) -> Tree:
    """Everything that must survive a snapshot: types, modes, contents, link targets."""
    out: Tree = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", mode)
            else:
                out[rel] = ("file", mode, Path(full).read_bytes())
    return out


class RecordingFs:
    """Stands in for TmpdirFileSystem's reattach hook."""

    def __init__(self) -> None:
        self.reattached = 0

    def reattach(self) -> None:
        self.reattached += 1


@pytest.fixture
def layout(tmp_path: Path) -> TmpdirLayout:
    return TmpdirLayout("snaptest", tmp_path / "root")


def make(layout: TmpdirLayout, fs: RecordingFs | None = None) -> tuple[TmpdirSnapshotter, str]:
    name = layout.create_workspace("sess")

    def make_ref(n: str) -> WorkspaceRef:
        return WorkspaceRef("snaptest", {"workspace": n}, {"fs", "snapshot"}, 2)

    return TmpdirSnapshotter(layout, name, make_ref, fs=fs), layout.workspace_path(name)


def populate(root: str) -> None:
    r = Path(root)
    (r / "src" / "pkg").mkdir(parents=True)
    (r / "src" / "pkg" / "mod.py").write_text("print('hi')\n")
    (r / "bin.dat").write_bytes(bytes(range(256)) * 40)
    (r / "exec.sh").write_text("#!/bin/sh\n")
    (r / "exec.sh").chmod(0o750)
    (r / "private").write_text("secret-ish")
    (r / "private").chmod(0o600)
    (r / "shared").write_text("group")
    (r / "shared").chmod(0o664)
    (r / "empty").mkdir()
    (r / "ro").mkdir()
    (r / "ro" / "inside").write_text("x")
    (r / "ro").chmod(0o555)
    (r / "empty-file").write_bytes(b"")
    os.symlink("src/pkg/mod.py", r / "rel-link")
    os.symlink("/usr/bin/env", r / "abs-link")
    os.symlink("missing", r / "dangling")
    os.symlink("src", r / "dir-link")
    (r / "ünï cödé").write_text("unicode name")


@pytest.mark.anyio
async def test_restore_brings_back_the_exact_tree(layout: TmpdirLayout) -> None:
    fs = RecordingFs()
    snap, root = make(layout, fs)
    populate(root)
    before = capture(root)
    info = await snap.snapshot("first")
    assert info.label == "first"
    assert info.size_bytes is not None
    assert info.size_bytes > 0

    r = Path(root)
    (r / "src" / "pkg" / "mod.py").write_text("changed")
    (r / "new").write_text("new")
    (r / "exec.sh").chmod(0o644)
    os.unlink(r / "rel-link")
    os.chmod(r / "ro", 0o755)
    (r / "empty").rmdir()
    assert capture(root) != before

    ref = await snap.restore(info.snapshot_id)
    assert ref == WorkspaceRef(
        "snaptest", {"workspace": os.path.basename(root)}, {"fs", "snapshot"}, 2
    )
    assert capture(root) == before
    assert fs.reattached == 0  # restored in place: the root fd stays valid
    # Nothing left over beside the workspaces.
    leftovers = [n for n in os.listdir(layout.base_dir) if n.startswith(".")]
    assert leftovers == []


@pytest.mark.anyio
async def test_restore_while_a_file_is_open(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    path = Path(root) / "log.txt"
    path.write_text("snapshot content")
    info = await snap.snapshot()
    path.write_text("later content")
    with open(path, encoding="utf-8") as held:
        await snap.restore(info.snapshot_id)
        assert held.read() == "later content"  # the open file keeps its inode
    assert path.read_text() == "snapshot content"


@pytest.mark.anyio
async def test_list_is_oldest_first_and_delete_removes(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    assert await snap.list() == []
    ids = []
    for i in range(3):
        Path(root, "f").write_text(str(i))
        ids.append((await snap.snapshot(f"s{i}")).snapshot_id)
    listed = await snap.list()
    assert [s.snapshot_id for s in listed] == ids
    assert [s.label for s in listed] == ["s0", "s1", "s2"]
    assert all(s.size_bytes for s in listed)
    await snap.delete(ids[1])
    assert [s.snapshot_id for s in await snap.list()] == [ids[0], ids[2]]
    assert sorted(os.listdir(layout.snapshot_path(os.path.basename(root)))) == sorted(
        [f"{ids[0]}.manifest", f"{ids[0]}.json", f"{ids[2]}.manifest", f"{ids[2]}.json"]
    )
    with pytest.raises(OperationError) as info:
        await snap.delete(ids[1])
    assert info.value.code == "not_found"
    await snap.restore(ids[0])
    assert Path(root, "f").read_text() == "0"


@pytest.mark.anyio
@pytest.mark.parametrize("bad", ["nope", "../../etc/passwd", "snap-0000000000000000-00000000", ""])
async def test_unknown_or_hostile_ids_are_not_found(layout: TmpdirLayout, bad: str) -> None:
    snap, _ = make(layout)
    for call in (snap.restore, snap.delete, snap.branch):
        with pytest.raises(OperationError) as info:
            await call(bad)
        assert info.value.code == "not_found"
        assert bad == "" or bad not in info.value.message


@pytest.mark.anyio
async def test_label_is_bounded(layout: TmpdirLayout) -> None:
    snap, _ = make(layout)
    with pytest.raises(OperationError) as info:
        await snap.snapshot("x" * 201)
    assert info.value.code == "invalid_argument"


@pytest.mark.anyio
async def test_branch_is_an_independent_workspace(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    populate(root)
    before = capture(root)
    info = await snap.snapshot()
    ref = await snap.branch(info.snapshot_id)
    new_name = ref.payload["workspace"]
    assert new_name != os.path.basename(root)
    assert layout.is_workspace_name(new_name)
    assert new_name.startswith("ws-sess-")
    new_root = layout.workspace_path(new_name)
    assert capture(new_root) == before
    assert os.listdir(layout.snapshot_path(new_name)) == []
    Path(new_root, "only-in-branch").write_text("b")
    Path(root, "only-in-source").write_text("s")
    assert not Path(root, "only-in-branch").exists()
    assert not Path(new_root, "only-in-source").exists()
    layout.remove_workspace(new_name)
    assert Path(root, "only-in-source").exists()


@pytest.mark.anyio
async def test_fifos_are_skipped_and_logged(
    layout: TmpdirLayout, caplog: pytest.LogCaptureFixture
) -> None:
    snap, root = make(layout)
    os.mkfifo(os.path.join(root, "pipe"))
    Path(root, "keep").write_text("k")
    keep_mode = stat.S_IMODE(os.stat(os.path.join(root, "keep")).st_mode)
    info = await snap.snapshot()  # must not hang on the FIFO
    assert "skipped 1 special" in caplog.text
    os.unlink(os.path.join(root, "pipe"))
    Path(root, "keep").write_text("changed")
    await snap.restore(info.snapshot_id)
    assert capture(root) == {"keep": ("file", keep_mode, b"k")}


@pytest.mark.anyio
async def test_snapshot_of_a_vanished_workspace_is_evicted(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    os.rmdir(root)
    with pytest.raises(WorkspaceEvictedError):
        await snap.snapshot()


@pytest.mark.anyio
async def test_closed_snapshotter_refuses(layout: TmpdirLayout) -> None:
    snap, _ = make(layout)
    snap.close()
    with pytest.raises(OperationError) as info:
        await snap.list()
    assert info.value.code == "closed"


@pytest.mark.anyio
async def test_version_stores_no_owner_and_no_setuid(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    Path(root, "suid").write_text("x")
    os.chmod(os.path.join(root, "suid"), 0o4755)
    info = await snap.snapshot()
    raw = Path(
        layout.snapshot_path(os.path.basename(root)), f"{info.snapshot_id}.manifest"
    ).read_bytes()
    manifest = decode(raw, max_entries=10, max_bytes=10)
    assert manifest.name == ["", "suid"]
    assert manifest.mode[1] == 0o755
    # No column holds an owner: nothing about the host user is kept.
    columns = {f.name for f in attrs.fields(type(manifest))}
    assert columns == {
        "parent",
        "name",
        "kind",
        "mode",
        "size",
        "data",
        "key",
        "_kids",
        "_spans",  # a derived index of the parent column, never stored
        "_file_bytes",
        "_looked",  # name maps of directories looked up, never stored
    }
    os.chmod(os.path.join(root, "suid"), 0o4700)
    await snap.restore(info.snapshot_id)
    assert stat.S_IMODE(os.stat(os.path.join(root, "suid")).st_mode) == 0o755
