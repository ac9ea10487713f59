"""Snapshots never read through links to the outside, and hostile tarballs never write outside."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.provider import OperationError, WorkspaceRef
from corral_posix import TmpdirLayout, TmpdirSnapshotter

CANARY = b"CANARY-4f1c9e-do-not-leak"


def make(layout: TmpdirLayout) -> tuple[TmpdirSnapshotter, str]:
    name = layout.create_workspace("sess")
    snap = TmpdirSnapshotter(layout, name, lambda n: WorkspaceRef("snaptest", {"workspace": n}))
    return snap, layout.workspace_path(name)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    (out / "canary.txt").write_bytes(CANARY)
    (out / "dir").mkdir()
    (out / "dir" / "nested.txt").write_bytes(CANARY)
    return out


@pytest.fixture
def layout(tmp_path: Path) -> TmpdirLayout:
    return TmpdirLayout("snaptest", tmp_path / "root")


def _version_bytes(layout: TmpdirLayout, root: str, snapshot_id: str) -> bytes:
    """Everything a version stored: its manifest and every blob in the store."""
    path = Path(layout.snapshot_path(os.path.basename(root))) / f"{snapshot_id}.manifest"
    blobs = [p.read_bytes() for p in Path(layout.base_dir, "store").glob("??/*")]
    return b"".join([path.read_bytes(), *blobs])


@pytest.mark.anyio
async def test_snapshot_does_not_follow_links_outside(layout: TmpdirLayout, outside: Path) -> None:
    snap, root = make(layout)
    os.symlink(outside / "canary.txt", os.path.join(root, "file-link"))
    os.symlink(outside / "dir", os.path.join(root, "dir-link"))
    os.symlink("../../../outside", os.path.join(root, "relative-escape"))
    Path(root, "real.txt").write_text("mine")
    info = await snap.snapshot()
    raw = _version_bytes(layout, root, info.snapshot_id)
    assert CANARY not in raw
    assert b"nested.txt" not in raw
    assert b"mine" in raw
    os.unlink(os.path.join(root, "file-link"))
    await snap.restore(info.snapshot_id)
    assert os.readlink(os.path.join(root, "file-link")) == str(outside / "canary.txt")
    assert os.path.islink(os.path.join(root, "dir-link"))
    assert (outside / "canary.txt").read_bytes() == CANARY


def _plant(layout: TmpdirLayout, root: str, build: Callable[[tarfile.TarFile], None]) -> str:
    snap_id = "snap-00000000000000ff-deadbeef"
    area = Path(layout.snapshot_path(os.path.basename(root)))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        build(tar)
    (area / f"{snap_id}.tar.gz").write_bytes(buf.getvalue())
    (area / f"{snap_id}.json").write_text(
        json.dumps({"snapshot_id": snap_id, "created_at": 1.0, "label": None})
    )
    return snap_id


def _file(tar: tarfile.TarFile, name: str, data: bytes = b"PWNED", mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def _link(tar: tarfile.TarFile, name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    tar.addfile(info)


def _device(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.CHRTYPE
    info.devmajor, info.devminor = 1, 3
    tar.addfile(info)


def _hostile_builders(outside: Path) -> dict[str, Callable[[tarfile.TarFile], None]]:
    return {
        "dotdot": lambda t: _file(t, "../../../outside/pwn.txt"),
        "absolute": lambda t: _file(t, str(outside / "pwn.txt")),
        "link-then-file": lambda t: (_link(t, "esc", str(outside)), _file(t, "esc/pwn.txt")),
        "file-then-link": lambda t: (_file(t, "esc/pwn.txt"), _link(t, "esc", str(outside))),
        "hardlink-out": lambda t: _link(t, "hl", str(outside / "canary.txt"), tarfile.LNKTYPE),
        "device": lambda t: _device(t, "null"),
        "link-dotdot-name": lambda t: _link(t, "../pwn-link", "/etc"),
    }


@pytest.mark.anyio
@pytest.mark.parametrize(
    "case",
    [
        "dotdot",
        "absolute",
        "link-then-file",
        "file-then-link",
        "hardlink-out",
        "device",
        "link-dotdot-name",
    ],
)
async def test_hostile_tarball_cannot_write_outside(
    layout: TmpdirLayout, outside: Path, case: str
) -> None:
    snap, root = make(layout)
    Path(root, "keep.txt").write_text("original")
    snap_id = _plant(layout, root, _hostile_builders(outside)[case])
    before_outside = sorted(p.name for p in outside.rglob("*"))
    with pytest.raises(OperationError) as info:
        await snap.restore(snap_id)
    assert info.value.code == "failed"
    assert "outside" not in info.value.message
    assert sorted(p.name for p in outside.rglob("*")) == before_outside
    assert (outside / "canary.txt").read_bytes() == CANARY
    assert not (Path(layout.base_dir).parent / "pwn-link").exists()
    # The failed restore left the workspace untouched and no scratch dirs behind.
    assert sorted(os.listdir(root)) == ["keep.txt"]
    assert Path(root, "keep.txt").read_text() == "original"
    assert [n for n in os.listdir(layout.base_dir) if n.startswith(".")] == []
    with pytest.raises(OperationError):
        await snap.branch(snap_id)
    assert sorted(n for n in os.listdir(layout.base_dir) if n.startswith("ws-")) == [
        os.path.basename(root)
    ]


@pytest.mark.anyio
async def test_setuid_bits_are_dropped_on_restore(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    snap_id = _plant(layout, root, lambda t: _file(t, "tool", b"#!/bin/sh\n", mode=0o6755))
    await snap.restore(snap_id)
    assert stat.S_IMODE(os.stat(os.path.join(root, "tool")).st_mode) == 0o755


_names = st.text(alphabet="abcxyz_-.é", min_size=1, max_size=6).filter(
    lambda n: n not in (".", "..")
)
_trees = st.dictionaries(
    st.lists(_names, min_size=1, max_size=3).map(tuple),
    st.one_of(
        st.tuples(st.just("file"), st.binary(max_size=64), st.sampled_from([0o600, 0o644, 0o755])),
        st.tuples(st.just("link"), _names),
        st.tuples(st.just("dir"), st.sampled_from([0o700, 0o755, 0o500])),
    ),
    max_size=8,
)


def _build(root: Path, tree: dict[tuple[str, ...], tuple[object, ...]]) -> None:
    dirs_ro: list[tuple[Path, int]] = []
    for parts, spec in sorted(tree.items()):
        path = root.joinpath(*parts)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if spec[0] == "file":
                path.write_bytes(spec[1])  # type: ignore[arg-type]
                path.chmod(spec[2])  # type: ignore[arg-type]
            elif spec[0] == "link":
                os.symlink(str(spec[1]), path)
            else:
                path.mkdir()
                dirs_ro.append((path, spec[1]))  # type: ignore[arg-type]
        except OSError:
            continue  # a prefix was already made a file or (looping) link: keep the first
    for path, mode in dirs_ro:
        path.chmod(mode)


def _capture(root: str) -> dict[str, tuple[object, ...]]:
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st_ = os.lstat(full)
            rel = os.path.relpath(full, root)
            if stat.S_ISLNK(st_.st_mode):
                out[rel] = ("link", os.readlink(full))
            elif stat.S_ISDIR(st_.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st_.st_mode))
            else:
                out[rel] = ("file", stat.S_IMODE(st_.st_mode), Path(full).read_bytes())
    return out


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=40, deadline=None)
@given(tree=_trees)
def test_round_trip_property(backend: str, tree: dict[tuple[str, ...], tuple[object, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        layout = TmpdirLayout("snaptest", tmp)
        snap, root = make(layout)
        _build(Path(root), tree)
        before = _capture(root)

        async def scenario() -> tuple[dict[str, tuple[object, ...]], dict[str, tuple[object, ...]]]:
            info = await snap.snapshot()
            Path(root, "zz-added").write_text("noise")
            await snap.restore(info.snapshot_id)
            restored = _capture(root)
            ref = await snap.branch(info.snapshot_id)
            return restored, _capture(layout.workspace_path(ref.payload["workspace"]))

        restored, branched = anyio.run(scenario, backend=backend)
        assert restored == before
        assert branched == before
        layout.remove_workspace(os.path.basename(root))
