"""The change journal: snapshots and restores that read only what changed stay exact.

The oracle is a fresh whole-tree scan with no previous manifest: after any
sequence of filesystem operations, a journal-driven snapshot must record
exactly what that scan sees, and a journal-driven restore must leave exactly
the version's tree. A journal that misses a kind of change fails it (shown
by a deliberately deaf journal below).
"""

from __future__ import annotations

import mmap
import os
import random
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.provider import WorkspaceRef
from corral_posix import (
    TmpdirLayout,
    TmpdirSnapshotter,
    _changes,
    _snapshots,
    _versions,
    remove_tree,
)
from corral_posix._manifest import Manifest

View = dict[str, tuple[str, int, str]]


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[TmpdirLayout]:
    yield TmpdirLayout("journaltest", tmp_path / "root")
    remove_tree(str(tmp_path / "root"))


def make(
    layout: TmpdirLayout,
    writers: Callable[[], list[int] | None] = list,
    patches: list[set[str]] | None = None,
) -> tuple[TmpdirSnapshotter, str]:
    name = layout.create_workspace("sess")

    def make_ref(n: str) -> WorkspaceRef:
        return WorkspaceRef("journaltest", {"workspace": n}, {"fs", "snapshot"}, 2)

    def patched(_root: str, _state: str, paths: object) -> None:
        if patches is not None:
            patches.append(set(paths))  # type: ignore[call-overload]

    snap = TmpdirSnapshotter(layout, name, make_ref, tree_writers=writers, after_patch=patched)
    return snap, layout.workspace_path(name)


def view(m: Manifest) -> View:
    return {
        m.path(i): (m.kind[i], m.mode[i], m.data[i] if m.kind[i] != "d" else "")
        for i in range(len(m))
    }


def live(root: str) -> View:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        manifest, _skipped = _versions.scan(fd, None, None, _versions.Caps(), time.time_ns())
    finally:
        os.close(fd)
    return view(manifest)


class Counting:
    """Counts journal-driven scans and restores that completed (not fell back)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.scans = self.applies = 0
        real_scan, real_apply = _snapshots.scan_changes, _snapshots.apply_changes

        def scan_changes(*args: object, **kwargs: object) -> object:
            out = real_scan(*args, **kwargs)  # type: ignore[arg-type]
            self.scans += 1
            return out

        def apply_changes(*args: object, **kwargs: object) -> object:
            out = real_apply(*args, **kwargs)  # type: ignore[arg-type]
            self.applies += 1
            return out

        monkeypatch.setattr(_snapshots, "scan_changes", scan_changes)
        monkeypatch.setattr(_snapshots, "apply_changes", apply_changes)


# -- the operations an agent's commands perform, over the whole domain --------


def _dirs(root: Path) -> list[Path]:
    return [root, *sorted(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())]


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _entries(root: Path) -> list[Path]:
    return sorted(root.rglob("*"))


def mutate(rng: random.Random, root: Path, *, links: bool) -> str:
    """Apply one random change to the tree; return its name (for failure messages)."""
    ops = [
        "new",
        "overwrite_same_size",
        "append",
        "truncate",
        "chmod",
        "mkdir_filled",
        "rm",
        "rmtree",
        "rename_file",
        "rename_over",
        "rename_dir",
        "symlink",
        "file_to_dir",
        "dir_to_file",
        "utime_back",
        "chmod_dir",
    ]
    if links:
        ops.append("hardlink")
    op = rng.choice(ops)
    files, dirs = _files(root), _dirs(root)
    d = rng.choice(dirs)
    name = f"n{rng.randrange(10_000)}"
    if op == "new" or (not files and op not in {"mkdir_filled", "symlink", "chmod_dir"}):
        (d / name).write_bytes(rng.randbytes(rng.randrange(0, 64)))
        return "new"
    f = rng.choice(files) if files else None
    if op == "overwrite_same_size" and f is not None:
        size = f.stat().st_size
        with open(f, "r+b") as fh:  # in place: same inode, same size
            data = fh.read()
            fh.seek(0)
            fh.write(bytes((b + 1) % 256 for b in data))
        assert f.stat().st_size == size
    elif op == "append" and f is not None:
        with open(f, "ab") as fh:
            fh.write(b"more")
    elif op == "truncate" and f is not None:
        os.truncate(f, 0)
    elif op == "chmod" and f is not None:
        f.chmod(rng.choice([0o600, 0o644, 0o755, 0o400]))
    elif op == "mkdir_filled":
        sub = d / name
        sub.mkdir()
        (sub / "inner").mkdir()
        (sub / "inner" / "x").write_text("fresh")
        (sub / "y").write_text("fresh too")
    elif op == "rm" and f is not None:
        f.unlink()
    elif op == "rmtree" and d != root:
        remove_tree(str(d))
    elif op == "rename_file" and f is not None:
        f.rename(d / name)
    elif op == "rename_over" and len(files) > 1:
        a, b = rng.sample(files, 2)
        a.replace(b)
    elif op == "rename_dir" and d != root:
        d.rename(d.parent / name)
    elif op == "symlink":
        target = rng.choice(["../x", "/etc/passwd", "missing", name])
        os.symlink(target, d / name)
    elif op == "file_to_dir" and f is not None:
        f.unlink()
        f.mkdir()
        (f / "z").write_text("was a file")
    elif op == "dir_to_file" and d != root:
        remove_tree(str(d))
        d.write_text("was a directory")
    elif op == "utime_back" and f is not None:
        st = f.stat()
        with open(f, "r+b") as fh:
            data = fh.read()
            fh.seek(0)
            fh.write(bytes(reversed(data)))
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime as before
    elif op == "chmod_dir":
        d.chmod(rng.choice([0o700, 0o755, 0o750]))
    elif op == "hardlink" and f is not None:
        os.link(f, d / name)
    else:
        (d / name).write_text("fallback")
        return "new"
    return op


async def _play(
    layout: TmpdirLayout, seed: int, steps: int, *, links: bool = False
) -> tuple[TmpdirSnapshotter, Counting | None]:
    rng = random.Random(seed)
    snap, root_s = make(layout)
    root = Path(root_s)
    for i in range(20):
        sub = root / f"d{i % 4}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{i}").write_text(f"file {i}\n")
    versions = [await snap.snapshot("start")]
    assert view(snap._manifest(versions[0].snapshot_id)[0]) == live(root_s)
    done: list[str] = []
    for step in range(steps):
        for _ in range(rng.randrange(1, 4)):
            done.append(mutate(rng, root, links=links))
        if rng.random() < 0.7:
            info = await snap.snapshot(f"step {step}")
            got = view(snap._manifest(info.snapshot_id)[0])
            assert got == live(root_s), (seed, step, done[-4:])
            versions.append(info)
        else:
            info = rng.choice(versions)
            await snap.restore(info.snapshot_id)
            assert live(root_s) == view(snap._manifest(info.snapshot_id)[0]), (
                seed,
                step,
                done[-4:],
            )
    return snap, None


@pytest.mark.anyio
@pytest.mark.parametrize("seed", range(8))
async def test_journal_driven_versions_equal_a_fresh_scan(
    layout: TmpdirLayout, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    counts = Counting(monkeypatch)
    snap, _ = await _play(layout, seed, 40)
    snap.close()
    # The journal really drove most operations (directory renames end it, and
    # the next whole walk starts a new one).
    assert counts.scans >= 5
    assert counts.applies >= 2


@pytest.mark.anyio
@pytest.mark.parametrize("seed", range(3))
async def test_hard_links_fall_back_to_whole_walks_and_stay_exact(
    layout: TmpdirLayout, seed: int
) -> None:
    snap, _ = await _play(layout, 100 + seed, 30, links=True)
    snap.close()


@pytest.mark.anyio
async def test_a_deaf_journal_is_caught_by_the_oracle(
    layout: TmpdirLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The oracle bites: a journal blind to in-place writes records stale content."""
    monkeypatch.setattr(
        _changes,
        "_WATCH_MASK",
        _changes._WATCH_MASK & ~(_changes._IN_MODIFY | _changes._IN_CLOSE_WRITE),
    )
    snap, root = make(layout)
    Path(root, "d").mkdir()
    Path(root, "d", "a").write_text("one")
    Path(root, "d", "b").write_text("two")
    time.sleep(_versions.RACY_NS / 1e9 * 1.5)
    await snap.snapshot()
    with open(Path(root, "d", "a"), "r+b") as fh:
        fh.write(b"ONE")
    info = await snap.snapshot()
    assert view(snap._manifest(info.snapshot_id)[0]) != live(root)
    snap.close()


@pytest.mark.anyio
async def test_only_changed_directories_are_read(
    layout: TmpdirLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap, root = make(layout)
    for i in range(30):
        Path(root, f"d{i}").mkdir()
        Path(root, f"d{i}", "f").write_text(str(i))
    await snap.snapshot()
    listed: list[int] = []
    real = _versions._listing

    def counting(fd: int, links: list[bool] | None = None) -> object:
        listed.append(fd)
        return real(fd, links)

    monkeypatch.setattr(_versions, "_listing", counting)
    Path(root, "d7", "f").write_text("changed")
    info = await snap.snapshot()
    assert len(listed) == 1  # d7 alone: writing a file in it changes nothing in the root
    assert view(snap._manifest(info.snapshot_id)[0]) == live(root)
    snap.close()


@pytest.mark.anyio
async def test_restore_reports_exactly_what_it_wrote(layout: TmpdirLayout) -> None:
    patches: list[set[str]] = []
    snap, root = make(layout, patches=patches)
    for i in range(10):
        Path(root, f"d{i}").mkdir()
        Path(root, f"d{i}", "f").write_text(str(i))
    base = await snap.snapshot()
    Path(root, "d3", "f").write_text("changed")
    Path(root, "d5", "new").write_text("new")
    await snap.snapshot()
    await snap.restore(base.snapshot_id)
    assert patches == [{"f", "new"}]
    assert live(root) == view(snap._manifest(base.snapshot_id)[0])
    snap.close()


@pytest.mark.anyio
async def test_a_process_mapping_a_file_writable_makes_the_walk_whole(
    layout: TmpdirLayout, tmp_path: Path
) -> None:
    """Writes through a shared mapping leave no event; the writers' maps are checked."""
    pids: list[int] = []
    snap, root = make(layout, writers=lambda: list(pids))
    target = Path(root, "d", "mapped")
    target.parent.mkdir()
    target.write_bytes(b"a" * 4096)
    time.sleep(_versions.RACY_NS / 1e9 * 1.5)
    await snap.snapshot()
    ready = tmp_path / "ready"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import mmap, os, sys, time
                fd = os.open({str(target)!r}, os.O_RDWR)
                m = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                os.close(fd)  # the mapping keeps the file open: no close event yet
                time.sleep(1.1)  # a later mtime tick than the snapshot's
                m[:1] = b"b"
                open({str(tmp_path / "ready")!r}, "w").close()
                sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
    )
    try:
        while not ready.exists():
            time.sleep(0.01)
        pids.append(child.pid)
        info = await snap.snapshot()
        assert view(snap._manifest(info.snapshot_id)[0]) == live(root)
        assert snap._changes is not None
        assert _changes.shared_writable_maps([child.pid], os.stat(root).st_dev)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    pids.clear()
    # Released: the close leaves an event, and the journal picks the file up again.
    with open(target, "r+b") as fh, mmap.mmap(fh.fileno(), 4096) as m:
        m[:1] = b"c"
    info = await snap.snapshot()
    assert view(snap._manifest(info.snapshot_id)[0]) == live(root)
    snap.close()


def test_no_shared_writable_maps_in_an_ordinary_process() -> None:
    assert not _changes.shared_writable_maps([os.getpid()], os.stat("/").st_dev)
    assert not _changes.shared_writable_maps([2**22 + 7], 0)  # no such process


@pytest.mark.anyio
async def test_unknown_writers_mean_whole_walks(
    layout: TmpdirLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = Counting(monkeypatch)
    snap, root = make(layout, writers=lambda: None)
    Path(root, "a").write_text("1")
    await snap.snapshot()
    Path(root, "a").write_text("2")
    info = await snap.snapshot()
    assert counts.scans == 0
    assert view(snap._manifest(info.snapshot_id)[0]) == live(root)
    snap.close()


@pytest.mark.anyio
async def test_what_the_journal_cannot_account_for_ends_it(
    layout: TmpdirLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory renamed, a refused watch, a queue overflow: whole walks, still exact."""
    counts = Counting(monkeypatch)
    snap, root = make(layout)
    for name in ("a", "b"):
        Path(root, name, "sub").mkdir(parents=True)
        Path(root, name, "sub", "f").write_text(name)
    await snap.snapshot()
    assert snap._changes is not None
    assert snap._changes.valid
    # 1. A watched directory renamed: its watches would name the old paths.
    Path(root, "a").rename(Path(root, "renamed"))
    Path(root, "renamed", "sub", "f").write_text("after the rename")
    info = await snap.snapshot()
    assert counts.scans == 0
    assert view(snap._manifest(info.snapshot_id)[0]) == live(root)
    assert snap._changes.valid  # the whole walk started a new journal
    # 2. More events than the kernel queues (16384 by default): overflow.
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    many = Path(root, "b", "sub")  # watched: each new name is its own event
    for i in range(limit + 10):
        (many / f"m{i}").touch()
    Path(root, "b", "sub", "f").write_text("late")
    info = await snap.snapshot()
    assert counts.scans == 0
    assert view(snap._manifest(info.snapshot_id)[0]) == live(root)
    for i in range(limit + 10):
        (many / f"m{i}").unlink()
    await snap.snapshot()
    # 3. The kernel refuses a watch (the per-user limit): no journal, whole walks.
    calls = _changes._hub.calls
    assert calls is not None
    monkeypatch.setattr(calls, "add", lambda *_args: -1)
    Path(root, "b", "sub", "f").write_text("changed again")
    info = await snap.snapshot()
    assert not snap._changes.valid
    assert view(snap._manifest(info.snapshot_id)[0]) == live(root)
    counts.scans = 0
    Path(root, "b", "sub", "f").write_text("and again")
    info = await snap.snapshot()
    assert counts.scans == 0
    assert view(snap._manifest(info.snapshot_id)[0]) == live(root)
    snap.close()


@pytest.mark.anyio
async def test_the_root_deleted_ends_the_journal(layout: TmpdirLayout) -> None:
    snap, root = make(layout)
    Path(root, "f").write_text("x")
    await snap.snapshot()
    assert snap._changes is not None
    remove_tree(root)
    os.mkdir(root)
    Path(root, "g").write_text("y")
    assert snap._changes.changes() is None
    info = await snap.snapshot()
    assert view(snap._manifest(info.snapshot_id)[0]) == live(root)
    snap.close()


@pytest.mark.anyio
async def test_a_deleted_base_version_is_never_taken_over(layout: TmpdirLayout) -> None:
    """The base's unchanged entries name blobs only its version keeps alive."""
    snap, root = make(layout)
    Path(root, "keep").mkdir()
    Path(root, "keep", "x").write_text("content no later version holds")
    Path(root, "d").mkdir()
    Path(root, "d", "f").write_text("f")
    time.sleep(_versions.RACY_NS / 1e9 * 1.5)
    first = await snap.snapshot()
    Path(root, "d", "f").write_text("changed")
    second = await snap.snapshot()
    await snap.restore(first.snapshot_id)  # touches d only; the base is now the first version
    await snap.delete(second.snapshot_id)
    await snap.delete(first.snapshot_id)  # x's blob is collected with the last version naming it
    Path(root, "d", "new").write_text("new")
    third = await snap.snapshot()
    assert await snap.read_file_at(third.snapshot_id, "/keep/x") == (
        b"content no later version holds"
    )
    snap.close()


@pytest.mark.anyio
async def test_a_forked_child_neither_trusts_nor_steals_the_journal(
    layout: TmpdirLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = Counting(monkeypatch)
    snap, root = make(layout)
    Path(root, "d").mkdir()
    Path(root, "d", "f").write_text("one")
    await snap.snapshot()
    Path(root, "d", "f").write_text("two")  # queued for the parent's journal
    pid = os.fork()
    if pid == 0:  # the child: its inherited journal is ended, the queue untouched
        ok = snap._changes is not None and not snap._changes.valid
        ok = ok and snap._changes.changes() is None
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    info = await snap.snapshot()
    assert counts.scans == 1
    assert view(snap._manifest(info.snapshot_id)[0]) == live(root)
    assert await snap.read_file_at(info.snapshot_id, "/d/f") == b"two"
    snap.close()
