"""The version store: incremental snapshots, restore by difference, integrity, crashes, GC."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.provider import OperationError, WorkspaceRef
from corral_posix import TmpdirLayout, TmpdirSnapshotter, _versions, remove_tree
from corral_posix._tarball import write_tree

from .test_snapshots import capture


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[TmpdirLayout]:
    yield TmpdirLayout("vertest", tmp_path / "root")
    # pytest's own tmp_path cleanup recurses once per level: deep trees go first.
    remove_tree(str(tmp_path / "root"))


def make(layout: TmpdirLayout, name: str | None = None) -> tuple[TmpdirSnapshotter, str]:
    name = name or layout.create_workspace("sess")

    def make_ref(n: str) -> WorkspaceRef:
        return WorkspaceRef("vertest", {"workspace": n}, {"fs", "snapshot"}, 2)

    return TmpdirSnapshotter(layout, name, make_ref), layout.workspace_path(name)


def blobs(layout: TmpdirLayout) -> set[Path]:
    return set(Path(layout.base_dir, "store").glob("??/*"))


def tree(root: str, n: int = 50) -> None:
    for i in range(n):
        d = Path(root, f"d{i % 5}")
        d.mkdir(exist_ok=True)
        (d / f"f{i}").write_bytes(f"content {i}\n".encode() * 10)


@pytest.mark.anyio
async def test_unchanged_files_are_not_read_again(
    layout: TmpdirLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap, root = make(layout)
    tree(root)
    await snap.snapshot("first")
    time.sleep(_versions.RACY_NS / 1e9 * 1.5)
    await snap.snapshot("warm")  # files written just before "first" were not yet trusted
    reads: list[str] = []
    real = _versions._hash_file

    def counting(dir_fd: int, name: str, *args: object) -> object:
        reads.append(name)
        return real(dir_fd, name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(_versions, "_hash_file", counting)
    stored = blobs(layout)
    await snap.snapshot("unchanged")
    assert reads == []
    assert blobs(layout) == stored
    Path(root, "d1", "f1").write_text("changed")
    await snap.snapshot("one change")
    assert reads == ["f1"]
    assert len(blobs(layout)) == len(stored) + 1


@pytest.mark.anyio
async def test_restore_touches_only_what_differs(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    tree(root)
    info = await snap.snapshot()
    keep = os.stat(os.path.join(root, "d0", "f0")).st_ino
    Path(root, "d2", "f2").write_text("changed")
    os.unlink(os.path.join(root, "d3", "f3"))
    Path(root, "d4", "extra").write_text("extra")
    before = capture(root)
    await snap.restore(info.snapshot_id)
    after = capture(root)
    assert after != before
    assert os.stat(os.path.join(root, "d0", "f0")).st_ino == keep  # untouched, not rewritten
    assert Path(root, "d3", "f3").exists()
    assert not Path(root, "d4", "extra").exists()
    changes = await snap.diff(info.snapshot_id)
    assert list(changes) == []


@pytest.mark.anyio
async def test_a_corrupt_or_missing_blob_is_named_and_never_restored(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    Path(root, "a.txt").write_text("original")
    info = await snap.snapshot()
    (blob,) = blobs(layout)
    blob.chmod(0o600)
    blob.write_text("tampered")
    Path(root, "a.txt").write_text("live")
    with pytest.raises(OperationError) as caught:
        await snap.read_file_at(info.snapshot_id, "/a.txt")
    assert info.snapshot_id in str(caught.value)
    assert "/a.txt" in str(caught.value)
    assert "corrupt" in str(caught.value)
    with pytest.raises(OperationError) as caught:
        await snap.restore(info.snapshot_id)
    assert "/a.txt" in str(caught.value)
    assert Path(root, "a.txt").read_text() == "live"
    assert [p.name for p in Path(root).iterdir()] == ["a.txt"]  # no temp file left
    blob.unlink()
    with pytest.raises(OperationError) as caught:
        await snap.read_file_at(info.snapshot_id, "/a.txt")
    assert "missing" in str(caught.value)


@pytest.mark.anyio
async def test_a_tampered_manifest_is_refused(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    Path(root, "a.txt").write_text("x")
    info = await snap.snapshot()
    path = Path(layout.snapshot_path(os.path.basename(root)), f"{info.snapshot_id}.manifest")
    path.write_bytes(path.read_bytes().replace(b"a.txt", b"..\0\0\0"))
    fresh, _ = make(layout, os.path.basename(root))  # another process: nothing cached
    with pytest.raises(OperationError):
        await fresh.restore(info.snapshot_id)
    assert Path(root, "a.txt").read_text() == "x"


@pytest.mark.anyio
async def test_delete_collects_unreferenced_blobs(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    Path(root, "shared").write_text("in both")
    Path(root, "f").write_text("one")
    first = await snap.snapshot()
    Path(root, "f").write_text("two")
    second = await snap.snapshot()
    assert len(blobs(layout)) == 3
    await snap.delete(first.snapshot_id)
    assert len(blobs(layout)) == 2
    await snap.restore(second.snapshot_id)
    await snap.delete(second.snapshot_id)
    assert blobs(layout) == set()


@pytest.mark.anyio
async def test_restore_never_writes_through_a_planted_symlink(
    layout: TmpdirLayout, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    snap, root = make(layout)
    Path(root, "a").mkdir()
    Path(root, "a", "x").write_text("mine")
    info = await snap.snapshot()
    Path(root, "a", "x").unlink()
    Path(root, "a").rmdir()
    os.symlink(outside, os.path.join(root, "a"))
    await snap.restore(info.snapshot_id)
    assert list(outside.iterdir()) == []
    assert not os.path.islink(os.path.join(root, "a"))
    assert Path(root, "a", "x").read_text() == "mine"


# Blocking work in a worker thread: the event loop adds nothing, so one backend.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_ten_thousand_levels(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(10_000):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.write(nxt := os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), b"deep")
        os.close(nxt)
    finally:
        os.close(fd)
    info = await snap.snapshot()
    # Agent paths stop at 4096 bytes; the deepest readable file is read by path.
    shallow = "/".join(["d"] * 2000)
    assert [e.name for e in await snap.ls_at(info.snapshot_id, shallow)] == ["d"]
    os.rename(os.path.join(root, "d"), os.path.join(root, "moved"))
    await snap.restore(info.snapshot_id)
    assert not os.path.exists(os.path.join(root, "moved"))
    assert list(await snap.diff(info.snapshot_id)) == []
    ref = await snap.branch(info.snapshot_id)
    other, _ = make(layout, ref.payload["workspace"])
    mine = await other.snapshot()
    assert list(await other.diff(mine.snapshot_id)) == []


@pytest.mark.anyio
async def test_tarball_snapshots_of_the_previous_schema_still_restore(
    layout: TmpdirLayout,
) -> None:
    snap, root = make(layout)
    Path(root, "old.txt").write_text("from a tarball")
    snap_id = "snap-00000000000000ff-deadbeef"
    area = Path(layout.snapshot_path(os.path.basename(root)))
    with open(area / f"{snap_id}.tar.gz", "wb") as out:
        write_tree(root, out)
    (area / f"{snap_id}.json").write_text(
        json.dumps({"snapshot_id": snap_id, "created_at": 1.0, "label": "old"})
    )
    Path(root, "old.txt").write_text("changed")
    await snap.restore(snap_id)
    assert Path(root, "old.txt").read_text() == "from a tarball"
    assert not (area / f"{snap_id}.tar.gz").exists()  # converted once
    assert [i.label for i in await snap.list()] == ["old"]
    assert await snap.read_file_at(snap_id, "/old.txt") == b"from a tarball"


_CHILD = textwrap.dedent(
    """
    import sys, anyio
    from corral import WorkspaceRef
    from corral_posix import TmpdirLayout, TmpdirSnapshotter, remove_tree
    base, name, op, arg = sys.argv[1:]
    layout = TmpdirLayout("vertest", base)
    snap = TmpdirSnapshotter(layout, name, lambda n: WorkspaceRef("vertest", {}, set(), 2))
    async def main():
        if op == "restore":
            await snap.restore(arg)
        else:
            await snap.snapshot(arg)
        print("done", flush=True)
    anyio.run(main)
    """
)


def _kill_midway(layout: TmpdirLayout, name: str, op: str, arg: str, delay: float) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(Path(layout.base_dir).parent), name, op, arg],
        stdout=subprocess.DEVNULL,
    )
    time.sleep(delay)
    child.send_signal(signal.SIGKILL)
    child.wait()


# Blocking work in a worker thread: the event loop adds nothing, so one backend.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_killed_restore_is_finished_on_recover(layout: TmpdirLayout) -> None:
    rng = random.Random(16)
    snap, root = make(layout)
    tree(root, 400)
    want = capture(root)
    info = await snap.snapshot("target")
    name = os.path.basename(root)
    for _ in range(4):
        for i in range(0, 400, 3):
            Path(root, f"d{i % 5}", f"f{i}").write_text(f"scribble {rng.random()}")
        Path(root, "d1", "extra").write_text("x")
        _kill_midway(layout, name, "restore", info.snapshot_id, rng.uniform(0.0, 0.6))
        fresh, _ = make(layout, name)
        await fresh.recover()
        got = capture(root)
        if Path(layout.state_path(name), "restore.journal").exists():
            pytest.fail("recover left the journal behind")
        # Either the restore had not started (nothing to finish) or it is now complete.
        if got != want:
            assert "extra" in {Path(p).name for p in got}, "a half-restored tree was left"
        await fresh.restore(info.snapshot_id)
        assert capture(root) == want


# Blocking work in a worker thread: the event loop adds nothing, so one backend.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_killed_snapshot_leaves_the_previous_versions_intact(
    layout: TmpdirLayout,
) -> None:
    rng = random.Random(61)
    snap, root = make(layout)
    tree(root, 400)
    first = await snap.snapshot("first")
    want = {p: await snap.read_file_at(first.snapshot_id, p) for p in ["/d0/f0", "/d4/f399"]}
    name = os.path.basename(root)
    for round_ in range(4):
        for i in range(round_, 400, 2):
            Path(root, f"d{i % 5}", f"f{i}").write_text(f"new {rng.random()}")
        _kill_midway(layout, name, "snapshot", f"r{round_}", rng.uniform(0.0, 0.6))
        fresh, _ = make(layout, name)
        listed = await fresh.list()
        assert listed[0].snapshot_id == first.snapshot_id
        for info in listed:
            await fresh.diff(info.snapshot_id)  # every listed version is whole and readable
        for path, data in want.items():
            assert await fresh.read_file_at(first.snapshot_id, path) == data
    fresh.collect_garbage()
    await fresh.restore(first.snapshot_id)
    assert await fresh.read_file_at(first.snapshot_id, "/d0/f0") == want["/d0/f0"]


@pytest.mark.anyio
async def test_a_version_another_process_deleted_is_not_taken_over(
    layout: TmpdirLayout,
) -> None:
    """A cached previous manifest names blobs its version alone kept alive."""
    snap, root = make(layout)
    Path(root, "kept").write_text("unchanged content")
    time.sleep(_versions.RACY_NS / 1e9 * 1.5)
    first = await snap.snapshot()
    other, _ = make(layout, os.path.basename(root))  # another process: its own caches
    await other.delete(first.snapshot_id)  # the blob of "kept" is collected
    second = await snap.snapshot()
    assert await snap.read_file_at(second.snapshot_id, "/kept") == b"unchanged content"


def _damage(path: Path) -> None:
    path.chmod(0o600)
    with open(path, "r+b") as fh:
        first = fh.read(1)
        fh.seek(0)
        fh.write(bytes([first[0] ^ 0xFF]))
    path.chmod(0o400)


@pytest.mark.parametrize("read", ["read_verified", "copy_verified"])
def test_a_blob_verified_before_is_hashed_again_once_its_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read: str
) -> None:
    """Verification is skipped only for a blob file that is unchanged since it hashed right."""
    import hashlib

    from corral_posix import _blobstore

    store = _blobstore.LocalBlobStore(str(tmp_path / "store"))
    data = b"verified content\n" * 100
    digest = hashlib.sha256(data).hexdigest()
    store.put(digest, data)
    blob = tmp_path / "store" / digest[:2] / digest[2:]
    old = time.time() - 10
    os.utime(blob, (old, old))  # settled: no later change can keep its times
    time.sleep(_blobstore._SETTLED_NS / 1e9 * 1.5)  # and its ctime with it
    hashed: list[int] = []
    real = hashlib.sha256

    def counting(*args: bytes) -> Any:
        hashed.append(1)
        return real(*args)

    monkeypatch.setattr(_blobstore.hashlib, "sha256", counting)

    def do() -> bytes:
        if read == "read_verified":
            return store.read_verified(digest, 1 << 20)
        out = tmp_path / f"out{len(hashed)}-{time.time_ns()}"
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            store.copy_verified(digest, fd, len(data))
        finally:
            os.close(fd)
        return out.read_bytes()

    assert do() == data
    assert len(hashed) == 1
    assert do() == data
    assert len(hashed) == 1  # unchanged since verified: not hashed again
    _damage(blob)
    with pytest.raises(_blobstore.BlobError) as caught:
        do()
    assert caught.value.reason == "corrupt"
    # A blob damaged right after it was written is caught too (times too recent to trust).
    data2 = b"fresh\n"
    digest2 = hashlib.sha256(data2).hexdigest()
    store.put(digest2, data2)
    assert store.read_verified(digest2, 100) == data2
    _damage(tmp_path / "store" / digest2[:2] / digest2[2:])
    with pytest.raises(_blobstore.BlobError):
        store.read_verified(digest2, 100)


@pytest.mark.parametrize(
    ("age_ns", "whole_seconds", "trusted"),
    [
        (0, False, False),  # changed just now: a change in the same tick keeps its stamps
        (-1, False, False),  # stamped after "now" (a clock step): never trusted
        ("window-1", False, False),
        ("window", False, True),
        ("window", True, False),  # whole-second stamps: maybe a coarse filesystem
        (2_999_999_999, True, False),
        (3_000_000_000, True, True),
    ],
)
def test_a_verified_blob_is_remembered_only_once_its_stamps_must_move(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    age_ns: int | str,
    whole_seconds: bool,
    trusted: bool,
) -> None:
    from corral_posix import _blobstore

    window = _blobstore._SETTLED_NS
    # Four ticks of the kernel's coarse clock, never under 10 ms: far below the
    # 200 ms a fixed rule needed, so a branch right after a snapshot is not hashed.
    assert 10_000_000 <= window <= 200_000_000
    now = 1_800_000_000_123_456_789
    age = {"window": window, "window-1": window - 1}.get(age_ns, age_ns)  # type: ignore[call-overload]
    stamp = (now - age) // 1_000_000_000 * 1_000_000_000 if whole_seconds else now - age
    if whole_seconds:
        monkeypatch.setattr(_blobstore.time, "time_ns", lambda: stamp + age)
    else:
        monkeypatch.setattr(_blobstore.time, "time_ns", lambda: now)
    monkeypatch.setattr(_blobstore, "_VERIFIED", {})
    store = _blobstore.LocalBlobStore(str(tmp_path / "store"))
    digest = "ab" * 32
    store._trust(digest, (1, 2, 3, stamp - 5 if not whole_seconds else stamp, stamp))
    assert (digest in _blobstore._VERIFIED) is trusted


@pytest.mark.anyio
async def test_a_branch_names_the_damaged_file_and_leaves_no_tree(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    for i in range(300):  # a whole directory written in one loop
        Path(root, f"f{i:03d}").write_text(f"file {i}\n")
    info = await snap.snapshot()
    before = set(os.listdir(layout.base_dir))
    await snap.conformance_damage(info.snapshot_id, "/f123", "corrupt")
    with pytest.raises(OperationError) as caught:
        await snap.branch(info.snapshot_id)
    assert "/f123" in str(caught.value)
    assert info.snapshot_id in str(caught.value)
    assert set(os.listdir(layout.base_dir)) == before  # the partial branch was removed


def test_write_files_refuses_a_name_that_is_not_a_digest(tmp_path: Path) -> None:
    from corral_posix import _blobstore

    store = _blobstore.LocalBlobStore(str(tmp_path / "store"))
    out = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for bad in ("../" * 20 + "etc/passwd", "A" * 64, "0" * 63):
            with pytest.raises(_blobstore.BlobError):
                store.write_files(out, [("x", bad, 1, 0o644)], umask=None, owner=None)
    finally:
        os.close(out)
    assert not (tmp_path / "x").exists()


def _trusted_blob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str, Path, bytes]:
    """A store holding one blob that hashed right and is trusted by its file's identity."""
    from corral_posix import _blobstore

    monkeypatch.setattr(_blobstore, "_VERIFIED", {})
    monkeypatch.setattr(_blobstore, "_CONTENT", _blobstore._ContentMemory(0))  # never from memory
    store = _blobstore.LocalBlobStore(str(tmp_path / "store"))
    store._can_clone = False  # the kernel copies (copy_file_range), as on tmpfs
    data = random.Random(3).randbytes(5000)
    digest, _size, _stored = store.put_fd(_readable(tmp_path / "src", data))
    time.sleep(_blobstore._SETTLED_NS / 1e9 * 1.5)  # its stamps settle: any change moves them
    assert store.read_verified(digest, 10_000) == data
    assert digest in _blobstore._VERIFIED
    return store, digest, tmp_path / "store" / digest[:2] / digest[2:], data


def _readable(path: Path, data: bytes) -> int:
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


@pytest.mark.parametrize("when", ["before", "during"])
def test_a_trusted_blob_changed_before_or_while_a_branch_copies_it_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A trusted blob is copied first and its identity looked at after: a change is still caught."""
    from corral_posix import _blobstore

    store, digest, blob, data = _trusted_blob(tmp_path, monkeypatch)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY)
    hashed: list[str] = []
    real_verified = _blobstore.LocalBlobStore.copy_verified

    def spy(self: Any, d: str, fd: int, size_hint: int = 0) -> int:
        hashed.append(d)
        return real_verified(self, d, fd, size_hint)

    monkeypatch.setattr(_blobstore.LocalBlobStore, "copy_verified", spy)
    try:
        store.write_files(out, [("ok", digest, len(data), 0o644)], umask=None, owner=None)
        assert (out_dir / "ok").read_bytes() == data
        assert hashed == []  # trusted: copied by the kernel, not hashed again
        if when == "before":
            _damage(blob)
        else:
            real_copy = os.copy_file_range

            def damaging(src: int, dst: int, count: int, *args: Any) -> int:
                monkeypatch.setattr(os, "copy_file_range", real_copy)
                _damage(blob)  # between the open and the copy
                return real_copy(src, dst, count, *args)

            monkeypatch.setattr(os, "copy_file_range", damaging)
        with pytest.raises(_blobstore.BlobError) as caught:
            store.write_files(
                out,
                [("a", digest, len(data), 0o644), ("b", digest, len(data), 0o644)],
                umask=None,
                owner=None,
            )
        assert caught.value.reason == "corrupt"
        assert caught.value.entry == 0
        assert hashed == [digest]  # the changed identity sent it to be hashed
        assert digest not in _blobstore._VERIFIED
    finally:
        os.close(out)


@pytest.mark.parametrize(
    ("names", "ok"),
    [
        ([], True),
        (["0123456789abcdef" * 4], True),
        (["ab" * 32, "cd" * 32], True),
        (["AB" * 32], False),  # upper-case digits name no blob
        (["ab" * 31 + "aB"], False),
        (["ab" * 31 + " a"], False),  # whitespace, which bytes.fromhex would skip
        (["ab" * 31 + "\t\n"], False),
        (["ab" * 31 + "a\u0660"], False),  # a non-ASCII digit
        (["ab" * 31 + "a\uff10"], False),  # a full-width digit
        (["ab" * 31 + "ag"], False),
        (["ab" * 32 + "a"], False),
        (["ab" * 31 + "a"], False),
        (["ab" * 32, "ab" * 31 + "a", "a"], False),  # the lengths add up, one is short
        (["ab" * 32, ""], False),
        (["../" * 21 + "x"], False),
    ],
)
def test_all_blob_names_accepts_exactly_64_lowercase_hex_digits(names: list[str], ok: bool) -> None:
    from corral_posix import _blobstore

    assert _blobstore.all_blob_names(names) is ok
    assert ok == all(_blobstore.BLOB_NAME.fullmatch(n) for n in names)


@given(
    st.lists(
        st.one_of(
            st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
            st.text(alphabet="0123456789abcdefABCDEF \t\n\x00g\u0660", min_size=60, max_size=66),
        ),
        max_size=5,
    )
)
@settings(max_examples=300, deadline=None)
def test_all_blob_names_agrees_with_the_blob_name_pattern(names: list[str]) -> None:
    from corral_posix import _blobstore

    assert _blobstore.all_blob_names(names) == all(_blobstore.BLOB_NAME.fullmatch(n) for n in names)


@pytest.mark.anyio
async def test_a_branch_from_remembered_bytes_still_notices_a_damaged_blob(
    layout: TmpdirLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral_posix import _blobstore

    monkeypatch.setattr(_blobstore, "_CONTENT", _blobstore._ContentMemory(64 << 20))
    monkeypatch.setattr(_blobstore, "_VERIFIED", {})
    snap, root = make(layout)
    for i in range(300):
        Path(root, f"f{i:03d}").write_text(f"file {i}\n")
    info = await snap.snapshot()
    time.sleep(_blobstore._SETTLED_NS / 1e9 * 1.5)  # the new blobs' stamps settle
    first = await snap.branch(info.snapshot_id)  # hashes every blob, remembers the bytes
    assert len(_blobstore._CONTENT.items) == 300
    opened: list[str] = []
    real_fill = _blobstore.LocalBlobStore._fill

    def counting(self: Any, fd: int, root_fd: int, digest: str, size: int, **kw: Any) -> None:
        opened.append(digest)
        real_fill(self, fd, root_fd, digest, size, **kw)

    monkeypatch.setattr(_blobstore.LocalBlobStore, "_fill", counting)
    second = await snap.branch(info.snapshot_id)
    assert opened == []  # every file came from memory
    for ref in (first, second):
        there = Path(layout.workspace_path(ref.payload["workspace"]))  # type: ignore[index]
        assert (there / "f123").read_text() == "file 123\n"
        assert sorted(os.listdir(there)) == sorted(os.listdir(root))
    await snap.conformance_damage(info.snapshot_id, "/f123", "corrupt")
    with pytest.raises(OperationError) as caught:
        await snap.branch(info.snapshot_id)
    assert "/f123" in str(caught.value)
    assert "corrupt" in str(caught.value)
    assert len(opened) == 1  # only the damaged file's blob was opened (and hashed)


def test_remembered_bytes_stay_within_their_budget() -> None:
    from corral_posix import _blobstore

    memory = _blobstore._ContentMemory(10_000)
    now = time.time_ns()
    for i in range(25):
        data = bytes([i]) * 1000
        memory.keep(f"{i:064x}", (1, i, len(data), now, now), data)
        cost = _blobstore._ContentMemory.overhead + 1000
        assert len(memory.items) * cost <= 10_000  # content and overhead, within budget
    assert f"{24:064x}" in memory.items  # the newest stays, the oldest went
    assert f"{0:064x}" not in memory.items
    assert len(memory.items) >= 4
    memory.drop(f"{24:064x}")
    assert f"{24:064x}" not in memory.items
    big = b"x" * (_blobstore._ContentMemory.small + 1)
    memory.keep("f" * 64, (1, 99, len(big), now, now), big)
    assert "f" * 64 not in memory.items  # only small blobs are kept
    memory.keep("e" * 64, (1, 98, 5, now, now), b"four")
    assert "e" * 64 not in memory.items  # bytes that are not the whole file are refused
    for _ in range(3):  # the same blob again replaces its entry, counted once
        memory.keep("d" * 64, (1, 97, 4, now, now), b"same")
    assert memory._used == sum(len(c) + memory.overhead for _i, c in memory.items.values())
    tiny = _blobstore._ContentMemory(100)
    tiny.keep("c" * 64, (1, 96, 4, now, now), b"four")  # its overhead alone is over the budget
    assert tiny.items == {}


def _large_tree(root: str) -> None:
    """Directories of large files (handed to the second thread) and of small ones (not)."""
    rng = random.Random(5)
    for d in range(5):
        where = Path(root, f"big{d}", "inner") if d == 4 else Path(root, f"big{d}")
        where.mkdir(parents=True)
        for i in range(12):
            (where / f"f{i}").write_bytes(rng.randbytes(rng.randrange(40_000, 120_000)))
        os.chmod(where / "f3", 0o640)
    small = Path(root, "small")
    small.mkdir()
    for i in range(40):
        (small / f"s{i}").write_text(f"small {i}\n")
    Path(root, "big0", "link").symlink_to("f1")
    os.chmod(Path(root, "big1"), 0o555)  # read-only when left: written by the walk itself


@pytest.mark.anyio
async def test_a_branch_of_large_files_written_on_two_threads_is_the_version(
    layout: TmpdirLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap, root = make(layout)
    _large_tree(root)
    info = await snap.snapshot()
    handed: list[str] = []
    real_take = _versions._Spread.take

    def counting(self: Any, ap: Any, dir_fd: int, t_dir: int, files: Any) -> bool:
        took: bool = real_take(self, ap, dir_fd, t_dir, files)
        if took:
            handed.append(ap.t.path(t_dir))
        return took

    monkeypatch.setattr(_versions, "_cpus", lambda: 2)
    monkeypatch.setattr(_versions._Spread, "take", counting)
    ref = await snap.branch(info.snapshot_id)
    there = layout.workspace_path(ref.payload["workspace"])  # type: ignore[index]
    try:
        assert capture(there) == capture(root)
        assert handed  # some directories were written by the second thread...
        assert "/small" not in handed  # ...never one of small files
        assert "/big1" not in handed  # ...nor one the walk leaves read-only
    finally:
        os.chmod(Path(there, "big1"), 0o755)
        os.chmod(Path(root, "big1"), 0o755)


@pytest.mark.anyio
async def test_a_damaged_blob_in_a_directory_of_the_second_thread_fails_the_branch(
    layout: TmpdirLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap, root = make(layout)
    _large_tree(root)
    info = await snap.snapshot()
    monkeypatch.setattr(_versions, "_cpus", lambda: 2)
    before = set(os.listdir(layout.base_dir))
    for damaged in ("/big2/f7", "/big4/inner/f11", "/big0/f0", "/small/s3"):
        await snap.conformance_damage(info.snapshot_id, damaged, "corrupt")
        with pytest.raises(OperationError) as caught:
            await snap.branch(info.snapshot_id)
        assert damaged in str(caught.value)
        assert "corrupt" in str(caught.value)
        assert set(os.listdir(layout.base_dir)) == before  # the partial branch was removed
        await snap.conformance_damage(info.snapshot_id, damaged, "corrupt")  # flipped back
    ref = await snap.branch(info.snapshot_id)
    there = layout.workspace_path(ref.payload["workspace"])  # type: ignore[index]
    assert capture(there) == capture(root)
    for top in (there, root):
        os.chmod(Path(top, "big1"), 0o755)
