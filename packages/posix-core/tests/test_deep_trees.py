"""Deep and wide trees: nothing recurses per level, nothing holds an fd per level.

A workspace's content decides its depth (issue 11, item 8: a 10,000-level
directory made close raise RecursionError, left trash behind, and every
later open died in the scratch sweep). Every walk here runs with a soft fd
limit far below the depth, so a walk that kept one fd per level would fail
with EMFILE, and at a depth far above the recursion limit.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral import RegexModuleEngine
from corral.provider import GrepOptions, OperationError
from corral_posix import TmpdirFileSystem, TmpdirLayout, _fdtree, remove_tree
from corral_posix import _layout as layout_module
from corral_posix._fdtree import DIR_FLAGS, DirChain, remove_tree_at

DEPTH = 10_000
assert sys.getrecursionlimit() < DEPTH


def make_deep(root: Path, depth: int = DEPTH, name: str = "d") -> None:
    """``root/d/d/.../d`` with a file at the bottom, built through dir fds."""
    fd = os.open(root, DIR_FLAGS)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            nxt = os.open(name, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open("leaf.txt", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644, dir_fd=fd)
        os.write(leaf, b"needle\n")
        os.close(leaf)
    finally:
        os.close(fd)


@contextlib.contextmanager
def few_fds(headroom: int = 96) -> Iterator[None]:
    """A soft RLIMIT_NOFILE far below the depth: one fd per level would fail.

    ``headroom`` free descriptors above what the process already holds (a
    long test session holds many; the limit counts descriptor numbers).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = len(os.listdir("/proc/self/fd")) + headroom
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_remove_tree_at_any_depth(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    make_deep(tmp_path / "x")
    with few_fds():
        remove_tree(str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_remove_tree_makes_locked_directories_accessible(tmp_path: Path) -> None:
    top = tmp_path / "t"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_text("x")
    (top / "a" / "link").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep").write_text("x")
    os.chmod(top / "a" / "b", 0o000)
    os.chmod(top / "a", 0o500)
    remove_tree(str(top))
    assert not top.exists()
    assert (tmp_path / "outside" / "keep").exists()  # the symlink was unlinked, not followed


def test_remove_tree_of_a_missing_path_or_a_file(tmp_path: Path) -> None:
    remove_tree(str(tmp_path / "missing"))
    (tmp_path / "f").write_text("x")
    remove_tree(str(tmp_path / "f"))
    assert not (tmp_path / "f").exists()


def test_chain_finds_its_parent_again_after_a_rename(tmp_path: Path) -> None:
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    top = os.open(tmp_path, DIR_FLAGS)
    chain = DirChain(top)
    try:
        for name in ("a", "b", "c"):
            assert chain.descend(name) == "entered"
        # The agent moves the current directory away: '..' is now another one.
        os.rename(tmp_path / "a" / "b" / "c", tmp_path / "elsewhere" / "c")
        chain.ascend()
        assert os.fstat(chain.fd).st_ino == (tmp_path / "a" / "b").stat().st_ino
        # Moving an ancestor too leaves no verified way back: a clean error.
        assert chain.descend("missing") == "gone"
        os.mkdir(tmp_path / "a" / "b" / "c2")
        assert chain.descend("c2") == "entered"
        os.rename(tmp_path / "a" / "b" / "c2", tmp_path / "elsewhere" / "c2")
        os.rename(tmp_path / "a", tmp_path / "a-moved")
        with pytest.raises(OperationError, match="changed while"):
            chain.ascend()
    finally:
        chain.close()
        os.close(top)


def test_remove_tree_at_refuses_nothing_outside(tmp_path: Path) -> None:
    (tmp_path / "w" / "d").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "s").write_text("x")
    os.symlink(tmp_path / "secret", tmp_path / "w" / "d" / "to-secret")
    fd = os.open(tmp_path, DIR_FLAGS)
    try:
        remove_tree_at(fd, "w")
    finally:
        os.close(fd)
    assert (tmp_path / "secret" / "s").exists()


@pytest.fixture(scope="module")
def deep_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One 10,000-level workspace shared by the read-only walks.

    Removed here: pytest's own cleanup of old temp dirs is ``shutil.rmtree``,
    which would die on it with RecursionError in a later session.
    """
    root = tmp_path_factory.mktemp("deep")
    make_deep(root)
    yield root
    remove_tree(str(root / "d"))


@pytest.mark.anyio
async def test_walks_at_any_depth_hold_few_fds(deep_root: Path) -> None:
    fs = TmpdirFileSystem(deep_root, max_walk_depth=DEPTH + 10)
    try:
        with few_fds():
            hits = await fs.glob("**/leaf.txt")
            assert len(hits) == 1
            assert hits[0].count("/d") == DEPTH
            found = await fs.grep(RegexModuleEngine().compile("needle"), GrepOptions())
            assert [m.line for m in found.matches] == ["needle"]
            assert not found.skipped_paths
    finally:
        fs.close()


@pytest.mark.anyio
async def test_rm_recursive_at_any_depth(tmp_path: Path) -> None:
    make_deep(tmp_path)
    fs = TmpdirFileSystem(tmp_path)
    try:
        with few_fds():
            await fs.rm("/d", recursive=True)
        assert await fs.ls("/") == []
    finally:
        fs.close()


@pytest.mark.anyio
async def test_default_walk_depth_cap_applies(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    make_deep(root, 200)
    fs = TmpdirFileSystem(root)
    try:
        with pytest.raises(OperationError) as info:
            await fs.glob("**/leaf.txt")
        assert info.value.code == "too_large"
        found = await fs.grep(RegexModuleEngine().compile("needle"), GrepOptions())
        assert found.matches == ()
        assert found.skipped_paths  # the cut is reported, not silent
    finally:
        fs.close()


@pytest.fixture(scope="module")
def wide_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of 100,000 empty files."""
    root = tmp_path_factory.mktemp("wide")
    (root / "wide").mkdir()
    fd = os.open(root / "wide", DIR_FLAGS)
    try:
        for i in range(100_000):
            os.close(os.open(f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, dir_fd=fd))
    finally:
        os.close(fd)
    return root


@pytest.mark.anyio
async def test_wide_directory_hits_the_caps(wide_root: Path) -> None:
    fs = TmpdirFileSystem(wide_root, max_walk_entries=5_000)
    try:
        for call in (fs.ls("/wide"), fs.glob("**/*")):
            with pytest.raises(OperationError) as info:
                await call
            assert info.value.code == "too_large"
        found = await fs.grep(RegexModuleEngine().compile("x"), GrepOptions())
        assert found.skipped_paths == ("/wide",)
    finally:
        fs.close()


def _stale(layout: TmpdirLayout, kind: str) -> str:
    path = layout.new_temp_dir(kind)
    make_deep(Path(path), 2_000)
    os.utime(path, (0, 0))
    return path


def test_sweep_survives_any_error_and_sets_the_entry_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    layout = TmpdirLayout("sweeptest", tmp_path)
    layout.check_base()
    bad, good = _stale(layout, "trash"), _stale(layout, "tmp")
    real = layout_module.remove_tree
    calls: list[str] = []

    def flaky(path: str) -> None:
        calls.append(os.path.basename(path))
        if path == bad:
            raise RecursionError("what shutil.rmtree raised on 3.11")
        real(path)

    monkeypatch.setattr(layout_module, "remove_tree", flaky)
    monkeypatch.setattr(layout_module, "_LAST_SWEEP", {})
    name = layout.create_workspace("s")
    assert layout.is_workspace_name(name)
    assert not os.path.exists(good)
    assert not os.path.exists(bad)
    stuck = [n for n in os.listdir(layout.base_dir) if n.startswith(".stuck-")]
    assert len(stuck) == 1
    assert sum("could not be removed" in r.getMessage() for r in caplog.records) == 1
    # Later opens neither fail nor pay for the leftover again.
    monkeypatch.setattr(layout_module, "_LAST_SWEEP", {})
    calls.clear()
    layout.create_workspace("s")
    assert calls == []
    # ... until it is a day old; then it is retried and, now, removed.
    os.utime(os.path.join(layout.base_dir, stuck[0]), (0, 0))
    monkeypatch.setattr(layout_module, "_STUCK_RETRY_S", -1)
    monkeypatch.setattr(layout_module, "_LAST_SWEEP", {})
    layout.create_workspace("s")
    assert not os.path.exists(os.path.join(layout.base_dir, stuck[0]))


def test_sweep_removes_a_deep_leftover_and_close_leaves_no_trash(tmp_path: Path) -> None:
    layout = TmpdirLayout("deeptest", tmp_path)
    layout.check_base()
    stale = layout.new_temp_dir("trash")
    make_deep(Path(stale))
    os.utime(stale, (0, 0))
    name = layout.create_workspace("s")
    assert not os.path.exists(stale)
    make_deep(Path(layout.workspace_path(name)))
    with few_fds():
        layout.remove_workspace(name)
    assert [n for n in os.listdir(layout.base_dir) if n != "state"] == []


@pytest.mark.parametrize("became", ["dir", "symlink"])
def test_remove_tree_at_follows_an_entry_swapped_between_look_and_act(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, became: str
) -> None:
    """A rename exchange between the type check and the unlink/rmdir: look again."""
    parent = tmp_path / "p"
    parent.mkdir()
    target = parent / "x"
    if became == "dir":
        target.write_text("a file when looked at")
    else:
        target.mkdir()
        (target / "inner").write_text("a directory when looked at")
    real_stat = _fdtree.os.stat
    swapped = []

    def stat_then_swap(*args: Any, **kwargs: Any) -> os.stat_result:
        st = real_stat(*args, **kwargs)
        if not swapped and args and args[0] == "x":
            swapped.append(True)  # what a process inside does right after the look
            if became == "dir":
                target.unlink()
                target.mkdir()
                (target / "planted").write_text("now a directory")
            else:
                remove_tree(str(target))
                target.symlink_to("/etc")
        return st

    monkeypatch.setattr(_fdtree.os, "stat", stat_then_swap)
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _fdtree.remove_tree_at(fd, "x")
    finally:
        os.close(fd)
    assert swapped
    assert not os.path.lexists(target)
    assert os.path.isdir("/etc")
