"""The whole-directory fast paths of snapshot and restore never miss a change.

A snapshot takes over a directory in bulk when its live listing equals the
recorded keys of the previous version, and a restore skips a directory whose
listing equals the index and whose recorded content equals the target. These
tests change trees in every way a key must catch -- including a same-size
rewrite with the old mtime put back -- and check the result against what a
from-scratch reading of the tree says.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from corral.provider import OperationError
from corral_posix import TmpdirLayout, _versions
from corral_posix._manifest import MAGIC, Manifest, ManifestError, decode, diff

from .test_snapshots import capture
from .test_versions import blobs, layout, make, tree

__all__ = ["layout"]


def settle() -> None:
    """Let the racy window of the last scan pass, so its keys are trusted."""
    time.sleep(_versions.RACY_NS / 1e9 * 1.5)


def rewrite_keeping_mtime(path: Path, data: bytes) -> None:
    st = path.stat()
    assert len(data) == st.st_size
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.anyio
async def test_every_kind_of_change_is_seen_after_bulk_snapshots(
    layout: TmpdirLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap, root = make(layout)
    tree(root)
    os.symlink("f0", os.path.join(root, "d2", "link"))
    Path(root, "d4", "sub").mkdir()
    Path(root, "d4", "sub", "deep").write_text("deep")
    await snap.snapshot("first")
    settle()
    warm = await snap.snapshot("warm")
    settle()
    reads: list[str] = []
    real = _versions._hash_file

    def counting(dir_fd: int, name: str, *args: object) -> object:
        reads.append(name)
        return real(dir_fd, name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(_versions, "_hash_file", counting)
    f0 = Path(root, "d0", "f0")
    rewrite_keeping_mtime(f0, f0.read_bytes().upper())
    os.chmod(os.path.join(root, "d1", "f1"), 0o600)
    os.unlink(os.path.join(root, "d2", "link"))
    os.symlink("f7", os.path.join(root, "d2", "link"))
    os.unlink(os.path.join(root, "d3", "f3"))
    os.mkdir(os.path.join(root, "d3", "f3"))
    rewrite_keeping_mtime(Path(root, "d4", "sub", "deep"), b"DEEP")
    Path(root, "d4", "f9").unlink()
    Path(root, "new").mkdir()
    Path(root, "new", "x").write_text("x")
    live = capture(root)
    after = await snap.snapshot("after")
    changes = {(c.path, c.change) for c in await snap.diff(warm.snapshot_id, after.snapshot_id)}
    assert changes == {
        ("/d0/f0", "modified"),
        ("/d1/f1", "modified"),
        ("/d2/link", "modified"),
        ("/d3/f3", "modified"),
        ("/d4/sub/deep", "modified"),
        ("/d4/f9", "removed"),
        ("/new", "added"),
        ("/new/x", "added"),
    }
    # Only what changed was read (a chmod changes ctime, so f1 is read again).
    assert sorted(reads) == ["deep", "f0", "f1", "x"]
    assert await snap.read_file_at(after.snapshot_id, "/d0/f0") == f0.read_bytes()
    await snap.restore(warm.snapshot_id)
    await snap.restore(after.snapshot_id)
    assert capture(root) == live


@pytest.mark.anyio
async def test_restore_skips_unchanged_directories_but_reverts_live_edits(
    layout: TmpdirLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap, root = make(layout)
    tree(root)
    settle()
    base = await snap.snapshot("base")
    want = capture(root)
    for rel in ("d0/f0", "d1/f1", "d2/f2"):
        Path(root, rel).write_text("edited")
    settle()
    await snap.snapshot("edited")
    inode = os.stat(os.path.join(root, "d4", "f4")).st_ino
    # Edits after the last snapshot: the index does not know them; the restore must.
    rewrite_keeping_mtime(Path(root, "d3", "f3"), Path(root, "d3", "f3").read_bytes().upper())
    Path(root, "d4", "extra").write_text("extra")
    writes: list[str] = []
    real = _versions._Applier.write_file

    def counting(self: _versions._Applier, dir_fd: int, name: str, idx: int) -> None:
        writes.append(name)
        real(self, dir_fd, name, idx)

    monkeypatch.setattr(_versions._Applier, "write_file", counting)
    await snap.restore(base.snapshot_id)
    assert capture(root) == want
    assert sorted(writes) == ["f0", "f1", "f2", "f3"]
    assert os.stat(os.path.join(root, "d4", "f4")).st_ino == inode


@pytest.mark.anyio
async def test_branch_of_a_damaged_version_leaves_no_workspace(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    tree(root, 10)
    info = await snap.snapshot()
    victim = sorted(blobs(layout))[3]
    victim.chmod(0o600)
    victim.write_bytes(b"x" * len(victim.read_bytes()))
    before = set(os.listdir(layout.base_dir))
    with pytest.raises(Exception, match=info.snapshot_id):
        await snap.branch(info.snapshot_id)
    assert set(os.listdir(layout.base_dir)) == before


def _manifest(rows: list[tuple[int, str, str, int, int, str]]) -> Manifest:
    m = Manifest()
    for parent, name, kind, mode, size, data in rows:
        m.parent.append(parent)
        m.name.append(name)
        m.kind.append(kind)
        m.mode.append(mode)
        m.size.append(size)
        m.data.append(data)
        m.key.append(None)
    return m


H = "ab" * 32
GOOD = [(-1, "", "d", 0o755, 0, ""), (0, "a", "f", 0o644, 3, H)]


def test_format_2_round_trips_and_format_1_still_reads() -> None:
    m = _manifest(GOOD)
    m.key[1] = (0o100644, 1, 2, 3, 4, 5)
    back = decode(m.encode(), max_entries=10, max_bytes=10)
    assert (back.name, back.kind, back.data, back.key) == (m.name, m.kind, m.data, m.key)
    fields = [MAGIC]
    for row in GOOD:
        fields.extend(map(str, row))
        fields.append("1:2:3:4:5")
    old = decode("\0".join(fields).encode(), max_entries=10, max_bytes=10)
    assert old.name == ["", "a"]
    assert old.key == [None, None]  # keys of format 1 are never trusted


@pytest.mark.parametrize(
    "rows",
    [
        [*GOOD, (2, "b", "f", 0o644, 1, H)],  # parent after the child
        [*GOOD, (1, "b", "f", 0o644, 1, H)],  # parent is a file
        [*GOOD, (0, "..", "d", 0o755, 0, "")],
        [*GOOD, (0, "", "d", 0o755, 0, "")],
        [*GOOD, (0, "x" * 256, "d", 0o755, 0, "")],
        [*GOOD, (0, "a", "d", 0o755, 0, "")],  # duplicate
        [*GOOD, (0, "b", "f", 0o4755, 1, H)],  # setuid
        [*GOOD, (0, "b", "f", 0o644, -1, H)],
        [*GOOD, (0, "b", "f", 0o644, 1, "zz" * 32)],
        [*GOOD, (0, "b", "p", 0o644, 1, "")],
        [*GOOD, (0, "b", "l", 0o777, 0, "")],
        [*GOOD, (0, "b", "d", 0o755, 0, "data")],
        [*GOOD, (0, "b", "f", 0o644, 10**6, H)],  # over the byte cap
        [(0, "", "d", 0o755, 0, ""), *GOOD[1:]],  # root with a parent
    ],
)
def test_hostile_format_2_manifests_are_refused(
    rows: list[tuple[int, str, str, int, int, str]],
) -> None:
    with pytest.raises(ManifestError):
        decode(_manifest(rows).encode(), max_entries=10, max_bytes=1000)


def test_truncated_or_padded_format_2_is_refused() -> None:
    raw = _manifest(GOOD).encode()
    for bad in (raw[:-1], raw + b"\0", raw[:20], raw.replace(b"\x02\x00", b"\xff\xff", 1)):
        with pytest.raises(ManifestError):
            decode(bad, max_entries=10, max_bytes=10)
    with pytest.raises(ManifestError, match="entries"):
        decode(raw, max_entries=1, max_bytes=10)


@pytest.mark.anyio
async def test_a_damaged_version_does_not_lock_the_workspace(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    Path(root, "a").write_text("original")
    info = await snap.snapshot()
    for blob in blobs(layout):
        blob.unlink()
    Path(root, "a").write_text("live")
    with pytest.raises(OperationError, match="missing"):
        await snap.restore(info.snapshot_id)
    after = await snap.snapshot()  # the failed restore is not replayed first
    Path(root, "a").write_text("later")
    await snap.restore(after.snapshot_id)
    assert Path(root, "a").read_text() == "live"


@pytest.mark.anyio
async def test_storing_content_again_replaces_a_damaged_blob(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    Path(root, "a").write_text("same content")
    old = await snap.snapshot()
    (blob,) = blobs(layout)
    blob.chmod(0o600)
    blob.write_text("SAME CONTENT")
    Path(root, "b").write_text("same content")
    new = await snap.snapshot()
    assert await snap.read_file_at(new.snapshot_id, "/b") == b"same content"
    assert await snap.read_file_at(old.snapshot_id, "/a") == b"same content"


def _scattered(m: Manifest, order: list[int]) -> Manifest:
    """``m`` with its entries in another (parents-first) order: children no longer adjacent."""
    where = {old: new for new, old in enumerate(order)}
    out = Manifest()
    for old in order:
        out.parent.append(where[m.parent[old]] if old else -1)
        for column in ("name", "kind", "mode", "size", "data", "key"):
            getattr(out, column).append(getattr(m, column)[old])
    return decode(out.encode(), max_entries=100, max_bytes=10**6)


def test_walks_handle_manifests_whose_directories_are_not_contiguous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slice fast paths need a directory's entries side by side; others compare by name."""
    from corral_posix._blobstore import LocalBlobStore

    root = tmp_path / "ws"
    for rel in ("a/x", "b/y", "a/z"):
        Path(root, rel).parent.mkdir(parents=True, exist_ok=True)
        Path(root, rel).write_text(rel)
    store = LocalBlobStore(str(tmp_path / "store"))
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        settle()
        m0, _ = _versions.scan(fd, None, store, _versions.Caps(), time.time_ns())
        a, b = m0.children(0)["a"], m0.children(0)["b"]
        ax, az, by = m0.children(a)["x"], m0.children(a)["z"], m0.children(b)["y"]
        scattered = _scattered(m0, [0, a, b, ax, by, az])
        assert scattered.span(1) is None  # a's entries are split by b's
        assert scattered.span(2) == (4, 5)
        assert set(scattered.children(1)) == {"x", "z"}
        reads: list[str] = []
        real = _versions._hash_file

        def counting(dir_fd: int, name: str, *args: object) -> object:
            reads.append(name)
            return real(dir_fd, name, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(_versions, "_hash_file", counting)
        again, _ = _versions.scan(fd, scattered, None, _versions.Caps(), time.time_ns())
        assert reads == []  # every unchanged file recognised by name
        assert diff(again, m0) == []
        Path(root, "a", "z").write_text("A/Z")  # same size, new content
        Path(root, "b", "extra").write_text("extra")
        changed = _versions.apply(fd, scattered, scattered, store, "v")
        assert changed == 2
        assert Path(root, "a", "z").read_text() == "a/z"
        assert not Path(root, "b", "extra").exists()
    finally:
        os.close(fd)
