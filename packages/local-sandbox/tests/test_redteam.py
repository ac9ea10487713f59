"""Attacks found by red-teaming the issue 11 fixes, each against real bubblewrap.

Every test reproduces an attack that worked against the fixed code (and so
fails without the fix it covers), then asserts that it no longer does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import corral
import corral.provider
from corral_local_sandbox import LocalSandboxProvider, _quota

pytestmark = [pytest.mark.bwrap, pytest.mark.anyio]

HAS_GIT = shutil.which("git") is not None
GIT_ENV = (
    "export GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@b GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@b"
)


@asynccontextmanager
async def _workspace(
    tmp_path: Path, **options: Any
) -> AsyncIterator[tuple[corral.provider.Workspace, Path]]:
    """A real sandboxed workspace and its host directory."""
    provider = LocalSandboxProvider(tmpdir_root=str(tmp_path / "base"), **options)
    opened = await provider.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef("rt"))
    payload = opened.ref.payload
    assert isinstance(payload, dict)
    root = Path(str(payload["base_dir"])) / str(payload["workspace"])
    assert root.is_dir()
    try:
        yield opened.workspace, root
    finally:
        await opened.workspace.close()


async def _run(ws: corral.provider.Workspace, command: str) -> corral.ExecResult:
    assert ws.shell is not None
    return await ws.shell.run(
        corral.provider.CommandRequest(command, allow_shell_syntax=True, timeout_s=60.0)
    )


def _host_git_status(root: Path, home: Path) -> None:
    """What a person does next: ``git status`` in the workspace, on the host."""
    home.mkdir(exist_ok=True)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(
        ["git", "status", "--short"],
        cwd=root,
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )


# -- nested repositories: `git status` at the root obeys sub/.git/config ----------


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
async def test_nested_repository_config_cannot_run_host_code_via_git_status(
    tmp_path: Path,
) -> None:
    canary = tmp_path / "pwned"
    attack = f"""
    set -e; {GIT_ENV}
    git init -q .
    mkdir sub && cd sub && git init -q . && git commit -q --allow-empty -m i
    git config core.fsmonitor 'touch {canary}; false'
    cd .. && git add sub 2>/dev/null
    """
    async with _workspace(tmp_path) as (ws, root):
        result = await _run(ws, attack)
        assert result.exit_code == 0, result.stderr
        assert "sub/.git/config" in result.stderr
        _host_git_status(root, tmp_path / "home")
        assert not canary.exists()
        # git inside keeps working: the gitlink and the nested objects are kept.
        assert (root / "sub" / ".git" / "HEAD").exists()


@pytest.mark.skipif(not HAS_GIT, reason="git is not installed")
async def test_nested_gitdir_file_pointing_at_a_hostile_directory_is_moved_out(
    tmp_path: Path,
) -> None:
    canary = tmp_path / "pwned"
    attack = f"""
    set -e; {GIT_ENV}
    git init -q .
    mkdir sub && cd sub && git init -q . && git commit -q --allow-empty -m i
    git config core.fsmonitor 'touch {canary}; false'
    mv .git ../.evil && printf 'gitdir: ../.evil\\n' > .git
    cd .. && git add sub 2>/dev/null
    """
    async with _workspace(tmp_path) as (ws, root):
        result = await _run(ws, attack)
        assert result.exit_code == 0, result.stderr
        assert not (root / "sub" / ".git").exists()
        _host_git_status(root, tmp_path / "home")
        assert not canary.exists()


async def test_file_tools_refuse_a_nested_repository_config(tmp_path: Path) -> None:
    async with _workspace(tmp_path) as (ws, _root):
        assert ws.fs is not None
        await ws.fs.mkdir("/sub/.git", parents=True)
        for path in ("/sub/.git/config", "/a/b/.git/hooks/pre-commit", "/sub/.gitmodules"):
            with pytest.raises(corral.OperationError) as info:
                await ws.fs.write_file(path, b"[core]\n\tfsmonitor = x\n")
            assert info.value.code == "policy_denied"


async def test_nested_walk_survives_a_deep_tree_and_locked_directories(tmp_path: Path) -> None:
    deep = "/".join(["d"] * 1500)
    async with _workspace(tmp_path) as (ws, root):
        result = await _run(
            ws,
            f"mkdir -p {deep}/.git/hooks && echo x > {deep}/.git/hooks/post-checkout"
            " && mkdir -p locked/r/.git/hooks && chmod 000 locked",
        )
        assert result.exit_code == 0, result.stderr
        assert not (root / deep / ".git" / "hooks").exists()
        assert not (root / "locked" / "r" / ".git" / "hooks").exists()


# -- the disk quota: a walk a concurrent command keeps racing must fail closed -----


async def test_quota_fails_closed_when_the_workspace_cannot_be_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command moving directories under every walk kept the quota from ever applying."""

    def raced(_root: str) -> _quota.Usage:
        raise OSError("the workspace changed while it was measured")

    async with _workspace(tmp_path, limits={"disk_bytes": 1024 * 1024}) as (ws, _root):
        monkeypatch.setattr(_quota, "measure", raced)
        result = await _run(ws, "head -c 3000000 /dev/zero > big")
        assert "could not be measured" in result.stderr
        with pytest.raises(corral.OperationError) as info:
            await _run(ws, "head -c 3000000 /dev/zero > big2")
        assert info.value.code == "policy_denied"
        assert ws.fs is not None
        with pytest.raises(corral.OperationError):
            await ws.fs.write_file("/more", b"x")
        monkeypatch.undo()  # the mover stopped: the next walk succeeds, the real limit applies
        await ws.fs.rm("/big")
        assert (await _run(ws, "true")).exit_code == 0


def test_quota_walk_does_not_skip_a_directory_that_moved_after_it_was_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Skipping it let a directory hop between parents and go uncounted."""
    (tmp_path / "a").mkdir()
    real_scan = _quota._scan

    def scan_then_move(fd: int, seen: set[tuple[int, int]], usage: list[int]) -> list[str]:
        names = real_scan(fd, seen, usage)
        if "a" in names:  # the command moves "a" right after the walk listed it
            os.rename(tmp_path / "a", tmp_path / "b")
        return names

    monkeypatch.setattr(_quota, "_scan", scan_then_move)
    with pytest.raises(_quota._Raced):
        _quota._walk(str(tmp_path))
