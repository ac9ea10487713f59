"""The ray provider on a real three-node cluster: placement, resolve, failures, leases, teardown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral import ProviderConfig, SessionRef, ref_from_json, ref_to_json
from corral.provider import (
    CommandRequest,
    OperationError,
    WorkspaceEvictedError,
    WorkspaceFailedError,
)
from corral_ray import RayProvider
from corral_ray.testing import LocalCluster, processes_matching

from .conftest import node_of, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.ray, pytest.mark.slow]
ONE_BACKEND = pytest.mark.parametrize("anyio_backend", ["asyncio"])


def make(cluster: LocalCluster, **options: Any) -> RayProvider:
    """A provider on the test cluster; distinct ``max_workspaces_per_node`` = distinct agents."""
    options.setdefault("inner_options", {"tmpdir_root": str(cluster.root)})
    return RayProvider(address=cluster.address, **options)


def session(name: str) -> SessionRef:
    return SessionRef(session_id=name)


CONFIG = ProviderConfig(kind="ray")


async def test_required_resource_places_on_that_node(ray_cluster: LocalCluster) -> None:
    for resource in ("w1", "w2"):
        provider = make(ray_cluster, placement={"resource": resource})
        opened = [await provider.open(CONFIG, session(f"{resource}-{i}")) for i in range(2)]
        try:
            nodes = {o.ref.payload["node_id"] for o in opened}
            assert nodes == {node_of(resource)}
            assert opened[0].workspace.details()["ray_node_id"] == node_of(resource)
        finally:
            for o in opened:
                await o.workspace.close()


@ONE_BACKEND
async def test_spread_uses_every_node_and_pack_fills_one(ray_cluster: LocalCluster) -> None:
    spread = make(ray_cluster, placement="spread")  # the shared agents: every test closes its own
    opened: list[Any] = []

    async def open_one(i: int) -> None:
        opened.append(await spread.open(CONFIG, session(f"spread-{i}")))

    # Concurrent opens all see the same agent counts: they must still spread.
    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(open_one, i)
    try:
        assert len({o.ref.payload["node_id"] for o in opened}) == 3
    finally:
        for o in opened:
            await o.workspace.close()
    pack = make(ray_cluster, placement="pack", max_workspaces_per_node=2)
    opened = [await pack.open(CONFIG, session(f"pack-{i}")) for i in range(3)]
    try:
        nodes = [o.ref.payload["node_id"] for o in opened]
        assert nodes[0] == nodes[1] != nodes[2]
    finally:
        for o in opened:
            await o.workspace.close()


@ONE_BACKEND
async def test_unplaceable_open_waits_bounded_then_fails_transient(
    ray_cluster: LocalCluster,
) -> None:
    nowhere = make(ray_cluster, placement={"resource": "no-such-resource"}, open_timeout_s=1)
    started = time.monotonic()
    with pytest.raises(WorkspaceFailedError) as info:
        await nowhere.open(CONFIG, session("nowhere"))
    assert info.value.transient
    assert "no alive node matches the placement" in info.value.message
    assert time.monotonic() - started < 10

    # Capacity is the agent's: one workspace on w1, the second open has no room.
    tight = make(ray_cluster, placement={"resource": "w1"}, max_workspaces_per_node=1)
    impatient = make(
        ray_cluster, placement={"resource": "w1"}, max_workspaces_per_node=1, open_timeout_s=1
    )
    first = await tight.open(CONFIG, session("tight-1"))
    try:
        with pytest.raises(WorkspaceFailedError) as info:
            await impatient.open(CONFIG, session("tight-2"))
        assert info.value.transient
        assert "full" in info.value.message
    finally:
        await first.workspace.close()
    second = await tight.open(CONFIG, session("tight-3"))  # room again after the close
    await second.workspace.close()


async def test_modules_and_errors_cross_the_boundary(ray_cluster: LocalCluster) -> None:
    provider = make(ray_cluster, placement={"resource": "w2"})
    opened = await provider.open(CONFIG, session("modules"))
    ws = opened.workspace
    try:
        assert ws.fs is not None
        assert ws.shell is not None
        assert ws.snapshot is not None
        big = os.urandom(3 * 1024 * 1024)  # above Ray's inline limit: an object-store transfer
        await ws.fs.write_file("/big.bin", big)
        assert await ws.fs.read_file("/big.bin") == big
        with pytest.raises(OperationError) as info:
            await ws.fs.read_file("/missing")
        assert info.value.code == "not_found"
        with pytest.raises(OperationError) as info:
            await ws.fs.read_file("/big.bin", max_bytes=10)
        assert info.value.code == "too_large"
        result = await ws.shell.run(CommandRequest(command="wc -c big.bin"))
        assert result.exit_code == 0
        assert "3145728" in result.stdout
        with pytest.raises(OperationError) as info:
            await ws.shell.run(CommandRequest(command="ls", allowed_commands=frozenset({"cat"})))
        assert info.value.code == "policy_denied"
        snap = await ws.snapshot.snapshot("one")
        await ws.fs.write_file("/big.bin", b"changed")
        ref = await ws.snapshot.restore(snap.snapshot_id)
        assert ref.provider_id == "ray"
        assert ref.payload["node_id"] == node_of("w2")
        assert await ws.fs.read_file("/big.bin") == big
        branch_ref = await ws.snapshot.branch(snap.snapshot_id)
        branch = await provider.resolve(branch_ref)
        try:
            assert branch.id != ws.id
            assert branch.fs is not None
            assert await branch.fs.read_file("/big.bin") == big
        finally:
            await branch.close()
    finally:
        await ws.close()
    with pytest.raises(OperationError) as info:
        await ws.fs.read_file("/big.bin")
    assert info.value.code == "closed"
    with pytest.raises(WorkspaceFailedError):
        await provider.resolve(opened.ref)


_CHILD = """
import json, sys, anyio
from corral import ProviderConfig, SessionRef, ref_from_json, ref_to_json
from corral_ray import RayProvider
args = json.loads(sys.argv[1])
async def main():
    provider = RayProvider(address=args["address"], **args["options"])
    if args["mode"] == "open":
        opened = await provider.open(ProviderConfig(kind="ray"), SessionRef("child"))
        await opened.workspace.fs.write_file("/from-child.txt", b"child wrote this")
        print("REF=" + ref_to_json(opened.ref), flush=True)
    else:
        ws = await provider.resolve(ref_from_json(args["ref"]))
        data = await ws.fs.read_file("/from-parent.txt")
        await ws.fs.write_file("/from-child.txt", data + b" and the child read it")
        print("OK", flush=True)
anyio.run(main)
"""


def run_child(cluster: LocalCluster, mode: str, options: dict[str, Any], ref: str = "") -> str:
    """Another driver process: opens (and exits without closing) or resolves a ref."""
    args = json.dumps({"address": cluster.address, "options": options, "mode": mode, "ref": ref})
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, args],
        capture_output=True,
        text=True,
        timeout=120,
        env=cluster.env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@ONE_BACKEND
async def test_refs_resolve_from_other_drivers_also_after_the_opener_died(
    ray_cluster: LocalCluster,
) -> None:
    options = {"inner_options": {"tmpdir_root": str(ray_cluster.root)}, "placement": "spread"}
    provider = make(ray_cluster, placement="spread")

    # This driver opens; a second driver process resolves, reads and writes.
    opened = await provider.open(CONFIG, session("cross"))
    try:
        assert opened.workspace.fs is not None
        await opened.workspace.fs.write_file("/from-parent.txt", b"parent wrote this")
        out = await anyio.to_thread.run_sync(
            run_child, ray_cluster, "resolve", options, ref_to_json(opened.ref)
        )
        assert "OK" in out
        got = await opened.workspace.fs.read_file("/from-child.txt")
        assert got == b"parent wrote this and the child read it"
    finally:
        await opened.workspace.close()

    # A driver opens and dies; this one resolves the plain descriptor it left.
    out = await anyio.to_thread.run_sync(run_child, ray_cluster, "open", options)
    ref = ref_from_json(out.split("REF=", 1)[1].strip())
    ws = await provider.resolve(ref)
    try:
        assert ws.fs is not None
        assert await ws.fs.read_file("/from-child.txt") == b"child wrote this"
    finally:
        await ws.close()


@ONE_BACKEND
async def test_dead_driver_leaves_a_lease_the_agent_collects(ray_cluster: LocalCluster) -> None:
    options = {
        "inner_options": {"tmpdir_root": str(ray_cluster.root)},
        "lease_s": 1.5,
        "max_workspaces_per_node": 77,
    }
    out = await anyio.to_thread.run_sync(run_child, ray_cluster, "open", options)
    ref = ref_from_json(out.split("REF=", 1)[1].strip())
    inner_root = (
        Path(ref.payload["inner"]["payload"]["base_dir"])
        / ref.payload["inner"]["payload"]["workspace"]
    )
    assert inner_root.exists()
    provider = make(ray_cluster, lease_s=1.5, max_workspaces_per_node=77)

    # A live session keeps its lease: still there after several lease periods.
    opened = await provider.open(CONFIG, session("kept"))
    await anyio.sleep(3.5)
    assert opened.workspace.fs is not None
    await opened.workspace.fs.write_file("/still.txt", b"alive")

    with pytest.raises(WorkspaceFailedError) as info:
        await provider.resolve(ref)
    assert "lease expired" in info.value.message
    assert not inner_root.exists()  # collected: closed and deleted
    await opened.workspace.close()


@ONE_BACKEND
async def test_agent_teardown_kills_running_commands(ray_cluster: LocalCluster) -> None:
    from corral_ray import shutdown_agents

    provider = make(ray_cluster, placement={"resource": "w1"}, max_workspaces_per_node=55)
    opened = await provider.open(CONFIG, session("teardown"))
    shell = opened.workspace.shell
    assert shell is not None
    marker = "7.654321"

    async def long_command() -> None:
        # Killed under it: a result that is not a success, or the workspace is gone.
        try:
            result = await shell.run(CommandRequest(command=f"sleep {marker}", timeout_s=60))
        except (WorkspaceEvictedError, OperationError, WorkspaceFailedError):
            return
        assert result.exit_code != 0

    async with anyio.create_task_group() as tg:
        tg.start_soon(long_command)
        await anyio.to_thread.run_sync(
            wait_for, lambda: processes_matching(f"sleep {marker}"), 30, "the command to start"
        )
        closed = await anyio.to_thread.run_sync(shutdown_agents, provider.options.agent_tag())
        assert closed == 1
    assert processes_matching(f"sleep {marker}") == []
    await opened.workspace.close()  # the agent is gone: close still returns


@ONE_BACKEND
async def test_lost_node_fails_its_workspaces_naming_the_node(ray_cluster: LocalCluster) -> None:
    ray_cluster.start_node("doomed")
    opener = make(ray_cluster, placement={"resource": "doomed"})
    opened = await opener.open(CONFIG, session("doomed"))
    # The same configuration (so the same agents), waiting briefly for a lost node.
    provider = make(ray_cluster, placement={"resource": "doomed"}, open_timeout_s=3)
    node_id = opened.ref.payload["node_id"]
    assert opened.workspace.fs is not None
    assert opened.workspace.shell is not None
    await opened.workspace.fs.write_file("/a.txt", b"x")
    marker = "8.7654321"
    shell = opened.workspace.shell

    async def long_command() -> None:
        with pytest.raises(WorkspaceEvictedError):
            await shell.run(CommandRequest(command=f"sleep {marker}", timeout_s=60))

    async with anyio.create_task_group() as tg:
        tg.start_soon(long_command)
        await anyio.to_thread.run_sync(
            wait_for, lambda: processes_matching(f"sleep {marker}"), 30, "the command to start"
        )
        await anyio.sleep(0.5)  # the agent's watchdog has sampled it
        ray_cluster.kill_node("doomed")

    # The agent died with its raylet; its watchdog killed the command it ran.
    await anyio.to_thread.run_sync(
        wait_for, lambda: not processes_matching(f"sleep {marker}"), 15, "the command to die"
    )

    async def read_until_lost() -> None:
        for _ in range(300):
            await fs.read_file("/a.txt")
            await anyio.sleep(0.1)

    fs = opened.workspace.fs
    with pytest.raises(WorkspaceEvictedError) as evicted:
        await read_until_lost()
    assert node_id in evicted.value.message

    deadline = time.monotonic() + 60
    while True:
        with pytest.raises(WorkspaceFailedError) as failed:
            await provider.resolve(opened.ref)
        if "is gone" in failed.value.message or time.monotonic() > deadline:
            break
        await anyio.sleep(0.5)
    assert node_id in failed.value.message
    assert "is gone" in failed.value.message
    assert not failed.value.transient
    await opened.workspace.close()
