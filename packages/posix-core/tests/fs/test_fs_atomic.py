"""Atomic writes: readers see old or new content, a failed write leaves the old."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from corral.provider import OperationError
from corral_posix import TmpdirFileSystem

pytestmark = pytest.mark.anyio

SIZE = 256 * 1024


async def test_concurrent_readers_never_see_a_torn_file(fs: TmpdirFileSystem, root: Path) -> None:
    (root / "f").write_bytes(b"A" * SIZE)
    stop = threading.Event()
    torn: list[bytes] = []
    seen: set[bytes] = set()

    def reader() -> None:
        while not stop.is_set():
            data = (root / "f").read_bytes()
            if data not in (b"A" * SIZE, b"B" * SIZE):
                torn.append(data[:16])
            seen.add(data[:1])

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        for i in range(60):
            await fs.write_file("f", (b"B" if i % 2 == 0 else b"A") * SIZE)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert torn == []
    assert seen <= {b"A", b"B"}


async def test_a_write_that_fails_midway_leaves_the_old_content(
    fs: TmpdirFileSystem, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "d").mkdir()
    (root / "d" / "f").write_bytes(b"old")

    def crash(fd: int) -> None:
        raise OSError(5, "simulated crash before the rename")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OperationError) as info:
        await fs.write_file("d/f", b"new content")
    assert info.value.code == "failed"
    with pytest.raises(OperationError):
        await fs.edit_file("d/f", "old", "new")
    monkeypatch.undo()
    assert (root / "d" / "f").read_bytes() == b"old"
    assert sorted(p.name for p in (root / "d").iterdir()) == ["f"]


async def test_write_replaces_the_entry_not_the_inode(fs: TmpdirFileSystem, root: Path) -> None:
    (root / "f").write_bytes(b"old")
    before = (root / "f").stat().st_ino
    with (root / "f").open("rb") as held:
        await fs.write_file("f", b"new")
        assert held.read() == b"old"  # an open reader keeps the old inode
    assert (root / "f").stat().st_ino != before
    assert (root / "f").read_bytes() == b"new"
