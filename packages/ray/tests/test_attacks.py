"""Attacks through ``ray`` over local-sandbox: the proxy must not weaken the inner sandbox.

Each attack runs twice, through the ray provider (a node agent on the real
test cluster serving the inner workspace) and on local-sandbox directly with
the same options, and asserts the same outcome: the agent is a host process
holding a channel secret, Ray's environment and the cluster's processes, so
anything the proxy added to what a command or a file tool can reach would
show up here as a difference (or as a planted secret coming back).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral import ExecResult, ProviderConfig, SessionRef
from corral.provider import CommandRequest, OperationError, Workspace
from corral_local_sandbox import LocalSandboxProvider
from corral_ray import RayProvider
from corral_ray.testing import LocalCluster, processes_matching

from .test_channel import agent_endpoint

pytestmark = [pytest.mark.anyio, pytest.mark.ray, pytest.mark.bwrap, pytest.mark.slow]
ONE_BACKEND = pytest.mark.parametrize("anyio_backend", ["asyncio"])
PY = "/usr/bin/python3"
# Small limits so the bombs end quickly; one configuration = one shared agent.
LIMITS = {"processes": 64, "memory_bytes": 512 * 1024**2}


def _require_bwrap() -> None:
    if shutil.which("bwrap") is None:
        if os.environ.get("CORRAL_REQUIRE_BWRAP") == "1":
            pytest.fail("bubblewrap is not installed, and CORRAL_REQUIRE_BWRAP=1 requires it")
        pytest.skip("bubblewrap is not installed")


@asynccontextmanager
async def both(
    cluster: LocalCluster, tmp_path: Path
) -> AsyncIterator[tuple[Workspace, Workspace, str]]:
    """``(through ray, local-sandbox directly, the ray agent's name)``, same inner options."""
    _require_bwrap()
    ray_provider = RayProvider(
        address=cluster.address,
        inner="local-sandbox",
        inner_options={"tmpdir_root": str(cluster.root / "attacks"), "limits": LIMITS},
        placement={"resource": "w1"},
    )
    direct_provider = LocalSandboxProvider(tmpdir_root=str(tmp_path), limits=LIMITS)
    name = f"attack-{uuid.uuid4().hex[:8]}"
    proxied = await ray_provider.open(ProviderConfig(kind="ray"), SessionRef(name))
    try:
        direct = await direct_provider.open(ProviderConfig(kind="local-sandbox"), SessionRef(name))
        try:
            yield proxied.workspace, direct.workspace, str(proxied.ref.payload["agent"])
        finally:
            await direct.workspace.close()
    finally:
        await proxied.workspace.close()


async def sh(ws: Workspace, command: str, *, timeout_s: float = 20.0, **kw: Any) -> ExecResult:
    """Run a shell-syntax command in ``ws``."""
    assert ws.shell is not None
    request = CommandRequest(command, allow_shell_syntax=True, timeout_s=timeout_s, **kw)
    return await ws.shell.run(request)


FS_OPS = ("read_file", "stat", "ls", "write_file", "edit_file")


async def fs_outcome(ws: Workspace, op: str, path: str, secret: str) -> tuple[str, str]:
    """What a file tool call came to: ``("ok", repr)`` or ``("error", class:code|message)``."""
    fs = ws.fs
    assert fs is not None
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "read_file": lambda: fs.read_file(path),
        "stat": lambda: fs.stat(path),
        "ls": lambda: fs.ls(path),
        "write_file": lambda: fs.write_file(path + ".w", b"w"),
        "edit_file": lambda: fs.edit_file(path, secret, "x"),
    }
    try:
        value = await calls[op]()
    except OperationError as exc:
        return "error", f"{type(exc).__name__}:{exc.code}|{exc}"
    except Exception as exc:  # a non-contract error is a difference too
        return "raised", f"{type(exc).__name__}|{exc}"
    return "ok", re.sub(r"mtime=[^,)]*", "", repr(value))  # times differ, shapes must not


@pytest.fixture
def canary(ray_cluster: LocalCluster, tmp_path: Path) -> tuple[str, list[Path]]:
    """A random secret planted in host files the agent's user can read."""
    secret = f"canary-{uuid.uuid4().hex}"
    places = [ray_cluster.root / f"canary-{uuid.uuid4().hex[:8]}", tmp_path / "canary-dir"]
    for place in places:
        place.mkdir(parents=True)
        (place / "secret.txt").write_text(secret)
    return secret, places


@ONE_BACKEND
async def test_command_environment_holds_nothing_of_the_agent(
    ray_cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = f"driver-{uuid.uuid4().hex}"
    monkeypatch.setenv("CORRAL_ATTACK_DRIVER_VAR", marker)
    async with both(ray_cluster, tmp_path) as (proxied, direct, agent):
        info = await anyio.to_thread.run_sync(agent_endpoint, agent)
        probe = "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'"
        via_ray = await sh(proxied, probe)
        local = await sh(direct, "env")
        names = {line.split("=", 1)[0] for line in via_ray.stdout.splitlines() if "=" in line}
        env_names = {line.split("=", 1)[0] for line in local.stdout.splitlines() if "=" in line}
        assert names == env_names, names ^ env_names
        for leaked in ("RAY_", "PYTHONPATH", "VIRTUAL_ENV", "CORRAL_ATTACK_DRIVER_VAR"):
            assert leaked not in via_ray.stdout
        assert marker not in via_ray.stdout
        assert info["secret"].hex() not in via_ray.stdout
        assert str(ray_cluster.base) not in via_ray.stdout  # no path of the agent's session


@ONE_BACKEND
async def test_file_tools_leak_no_host_path(
    ray_cluster: LocalCluster, tmp_path: Path, canary: tuple[str, list[Path]]
) -> None:
    secret, places = canary
    async with both(ray_cluster, tmp_path) as (proxied, direct, _agent):
        links = " && ".join(
            f"ln -s {place} out{i} && ln -s {place}/secret.txt leak{i}"
            for i, place in enumerate(places)
        )
        for ws in (proxied, direct):
            made = await sh(ws, f"{links} && ln -s / root && ln -s .. up && echo made")
            assert made.stdout == "made\n", made.stderr
        paths = ["/x\0y", "/" + "a" * 300, "/" + "d/" * 3000 + "f", "/up/up/etc/passwd"]
        for i, place in enumerate(places):
            paths += [
                str(place / "secret.txt"),
                f"/../../..{place}/secret.txt",
                f"/leak{i}",
                f"/out{i}/secret.txt",
                f"/out{i}",
                f"/root{place}/secret.txt",
                f"/up{place}/secret.txt",
            ]
        for path in paths:
            for op in FS_OPS:
                got = await fs_outcome(proxied, op, path, secret)
                want = await fs_outcome(direct, op, path, secret)
                shown = path[:60]
                assert secret not in got[1], (shown, op)
                # No message names the workspace's host directory (the path given may echo).
                assert "corral-local-sandbox" not in got[1] + want[1], (shown, op)
                assert got[0] == want[0], (shown, op, got, want)
                assert got[1].split("|")[0] == want[1].split("|")[0], (shown, op, got, want)
        for place in places:  # nothing written through a link on the host
            assert sorted(p.name for p in place.iterdir()) == ["secret.txt"]
            assert (place / "secret.txt").read_text() == secret
        assert proxied.fs is not None
        found = await proxied.fs.glob("**/*", "/")
        assert not any(secret in entry for entry in found)
        tried = await sh(
            proxied, " ; ".join(f"cat {p}/secret.txt leak{i}" for i, p in enumerate(places))
        )
        assert secret not in tried.stdout + tried.stderr


@ONE_BACKEND
async def test_agent_and_cluster_processes_are_invisible(
    ray_cluster: LocalCluster, tmp_path: Path
) -> None:
    host_pids = processes_matching(str(ray_cluster.base))
    assert host_pids, "the cluster's processes were not found on the host"
    async with both(ray_cluster, tmp_path) as (proxied, direct, _agent):
        listing = "ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' '; echo; ps -eo args"
        via_ray = await sh(proxied, listing)
        local = await sh(direct, listing)
        pids = [int(p) for p in via_ray.stdout.splitlines()[0].split()]
        # A handful, as directly (the exact count varies with the sandbox's own
        # short-lived helpers); an unsandboxed inner sees the whole host (100+).
        assert len(pids) <= max(16, 2 * len(local.stdout.splitlines()[0].split()))
        assert not set(pids) & set(host_pids)
        # (bwrap's own command line, pid 1, names the workspace's host directory
        # on local-sandbox directly too: that is the inner sandbox's, not a leak.)
        for word in ("raylet", "ray::", "gcs_server", "corral_ray", "default_worker", "session_"):
            assert word not in via_ray.stdout
        # Signals to the host's pids reach nothing: those pids do not exist in here.
        targets = " ".join(str(p) for p in host_pids[:8])
        killed = await sh(
            proxied, f"for p in {targets}; do kill -0 $p 2>/dev/null && echo $p; done"
        )
        assert killed.stdout == ""
    assert all(os.path.exists(f"/proc/{p}") for p in host_pids[:8])


@ONE_BACKEND
async def test_sandbox_cannot_reach_the_agent_channel(
    ray_cluster: LocalCluster, tmp_path: Path
) -> None:
    # A wrong secret from the host is refused: test_channel covers it.
    async with both(ray_cluster, tmp_path) as (proxied, _direct, agent):
        info = await anyio.to_thread.run_sync(agent_endpoint, agent)
        connect = (
            f'{PY} -c "import socket; s=socket.create_connection('
            f"('{info['host']}', {info['port']}), timeout=3); print('got', len(s.recv(64)))\""
        )
        result = await sh(proxied, connect)
        assert result.exit_code != 0
        assert "got" not in result.stdout
        assert "Errno" in result.stderr or "refused" in result.stderr.lower()


@ONE_BACKEND
async def test_bombs_stay_in_the_sandbox_and_the_agent_serves_on(
    ray_cluster: LocalCluster, tmp_path: Path
) -> None:
    async with both(ray_cluster, tmp_path) as (proxied, direct, _agent):
        fork_bomb = "b() { b | b & }; b"
        memory_bomb = f"{PY} -c 'x = bytearray(2 * 1024**3); print(len(x))'"
        with anyio.fail_after(60):  # a hang here is the bug; not a timing assertion
            for ws in (proxied, direct):
                bomb = await sh(ws, fork_bomb, timeout_s=3.0)
                assert bomb.timed_out or bomb.exit_code is not None
                hog = await sh(ws, memory_bomb)
                assert hog.exit_code != 0
                assert hog.stdout == ""
                assert hog.signal == 9 or "MemoryError" in hog.stderr
                after = await sh(ws, "echo alive")
                assert after.stdout == "alive\n"
        assert proxied.fs is not None
        await proxied.fs.write_file("/after.txt", b"still serving")
        assert await proxied.fs.read_file("/after.txt") == b"still serving"
