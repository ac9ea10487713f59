"""Limits bound the workspace, not one process: a memory cgroup and a disk quota.

Real bubblewrap; memory use stays moderate (at most ~300 MiB resident at once).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import corral
import corral.provider
from corral_local_sandbox import LocalSandboxProvider, SandboxLimits
from corral_local_sandbox._quota import measure

MIB = 1024 * 1024

HOG = "import time\nb = b'\\x01' * (200 << 20)\ntime.sleep(3)\n"


@pytest.mark.bwrap
@pytest.mark.anyio
async def test_memory_bounds_all_processes_together(open_ws: Any, sh: Callable[..., Any]) -> None:
    # Five processes of 200 MiB each under 256 MiB: per-process RLIMIT_AS let
    # all five live (~1 GiB); the workspace's cgroup must kill some of them.
    async with open_ws(limits={"memory_bytes": 256 * MIB}) as ws:
        details = ws.details()
        assert details["memory_limit"] == "memory cgroup"
        script = (
            'pids=""; for i in 1 2 3 4 5; do python3 -c "$HOG" & pids="$pids $!"; done; '
            "dead=0; for p in $pids; do wait $p || dead=$((dead + 1)); done; echo $dead"
        )
        result = await sh(ws, script, env={"HOG": HOG}, timeout_s=60)
        assert int(result.stdout.split()[-1]) >= 1, result
        peaks = [
            int(Path(path, name).read_text())
            for path in details["cgroups"]
            for name in ("memory.max_usage_in_bytes", "memory.peak")
            if Path(path, name).exists()
        ]
        assert peaks, "the workspace cgroup records no memory peak"
        assert max(peaks) <= 256 * MIB


@pytest.mark.bwrap
@pytest.mark.anyio
async def test_disk_quota_refuses_until_cleaned(
    open_ws: Any, sh: Callable[..., Any], tmp_path: Path
) -> None:
    # Six 60 MiB files, each under the per-file limit, 360 MiB in all under a 64 MiB quota.
    async with open_ws(limits={"disk_bytes": 64 * MIB}) as ws:
        assert ws.details()["disk_quota_bytes"] == 64 * MIB
        result = await sh(ws, "for i in 1 2 3 4 5 6; do head -c 62914560 /dev/zero > f$i; done")
        assert "over its disk quota" in result.stderr
        with pytest.raises(corral.OperationError) as info:
            await sh(ws, "true")
        assert info.value.code == "policy_denied"
        assert "disk quota" in str(info.value)
        for write in (ws.fs.write_file("/x", b"x"), ws.fs.mkdir("/d")):
            with pytest.raises(corral.OperationError) as info:
                await write
            assert info.value.code == "policy_denied"
        # Another process resolving the workspace sees the same refusal.
        other = LocalSandboxProvider(tmpdir_root=str(tmp_path), limits={"disk_bytes": 64 * MIB})
        root = ws.details()["root"]
        name = os.path.basename(root)
        ref = corral.WorkspaceRef(
            provider_id="local-sandbox",
            payload={
                "workspace": name,
                "base_dir": os.path.dirname(root),
                "max_file_bytes": 10 * MIB,
            },
            capabilities=frozenset({"fs", "shell"}),
            schema_version=2,
        )
        again = await other.resolve(ref)  # not closed: that would remove the workspace
        with pytest.raises(corral.OperationError):
            await sh(again, "true")
        for i in range(1, 7):
            await ws.fs.rm(f"/f{i}")
        assert (await sh(ws, "echo back")).stdout == "back\n"
        await ws.fs.write_file("/x", b"x")


@pytest.mark.bwrap
@pytest.mark.anyio
async def test_exec_failures_exit_127_and_126(open_ws: Any, sh: Callable[..., Any]) -> None:
    async with open_ws() as ws:
        await ws.fs.write_file("/plain.sh", b"#!/bin/sh\necho hi\n")
        await ws.fs.mkdir("/adir")
        run = ws.shell.run
        missing = await run(corral.provider.CommandRequest("no-such-program-xyz"))
        assert missing.exit_code == 127
        assert "not found" in missing.stderr
        assert (await run(corral.provider.CommandRequest("./no-such-file"))).exit_code == 127
        assert (await run(corral.provider.CommandRequest("./plain.sh"))).exit_code == 126
        assert (await run(corral.provider.CommandRequest("./adir"))).exit_code == 126
        assert (await run(corral.provider.CommandRequest("/workspace/plain.sh"))).exit_code == 126
        assert (await sh(ws, "no-such-program-xyz")).exit_code == 127
        ok = await run(corral.provider.CommandRequest("sh ./plain.sh"))
        assert (ok.exit_code, ok.stdout) == (0, "hi\n")
        assert (await run(corral.provider.CommandRequest("false"))).exit_code == 1


def test_file_size_limit_never_exceeds_the_quota() -> None:
    assert SandboxLimits(disk_bytes=5 * MIB).effective_file_size() == 5 * MIB
    assert SandboxLimits(disk_bytes=None).effective_file_size() == 1024**3
    assert SandboxLimits(file_size_bytes=None, disk_bytes=None).effective_file_size() is None
    assert "--fsize=5242880:5242880" in SandboxLimits(disk_bytes=5 * MIB).prlimit_args()


def test_measure_counts_blocks_once_per_inode(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * MIB)
    for i in range(3):
        os.link(tmp_path / "a", tmp_path / f"link{i}")
    os.symlink("/usr", tmp_path / "usr")  # never followed
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * MIB)
    usage = measure(str(tmp_path))
    assert 2 * MIB <= usage.bytes < 3 * MIB
    assert usage.entries == 7


def test_measure_walks_a_deep_tree_without_recursion_or_fds(tmp_path: Path) -> None:
    depth = 3000  # three times Python's recursion limit, more fds than a low RLIMIT_NOFILE
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        with os.fdopen(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as fh:
            fh.write(b"z" * MIB)
    finally:
        os.close(fd)
    usage = measure(str(tmp_path))
    assert usage.entries == depth + 1
    assert usage.bytes >= MIB
    _remove_chain(tmp_path, depth)


def _remove_chain(root: Path, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.unlink("leaf", dir_fd=fd)
    for _ in range(depth):
        parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = parent
        os.rmdir("d", dir_fd=fd)
    os.close(fd)
