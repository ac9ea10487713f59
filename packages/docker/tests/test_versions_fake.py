"""Docker's versions without a daemon: wiring, the command gate, remote engines narrowed."""

from __future__ import annotations

import pathlib

import anyio
import pytest

import corral
import corral.provider
from corral_docker import DockerProvider, FakeDockerEngine
from corral_docker._archive_versions import ArchiveSnapshotter
from corral_docker._versions import KILL_EXECS, CommandGate

pytestmark = pytest.mark.anyio

CONFIG = corral.ProviderConfig("docker", {"image": "corral-test:latest"})


def _provider(fake: FakeDockerEngine, root: str) -> DockerProvider:
    return DockerProvider(engine=fake, tmpdir_root=root)


async def test_restore_stops_commands_then_restores_in_place(
    fake: FakeDockerEngine, tmp_root: str
) -> None:
    opened = await _provider(fake, tmp_root).open(CONFIG, corral.SessionRef("s"))
    ws = opened.workspace
    assert ws.fs is not None
    assert ws.snapshot is not None
    root = pathlib.Path(corral.provider.describe_workspace(ws)["root"])
    root_ino = root.stat().st_ino
    await ws.fs.write_file("/a.txt", b"one")
    info = await ws.snapshot.snapshot()
    await ws.fs.write_file("/a.txt", b"two")
    await ws.fs.write_file("/extra.txt", b"x")
    kills = len([e for e in fake.execs if KILL_EXECS in e.argv])
    assert await ws.snapshot.restore(info.snapshot_id) == opened.ref
    assert await ws.fs.read_file("/a.txt") == b"one"
    assert not (root / "extra.txt").exists()
    # In place: the bind-mounted directory is the same inode, the container the same.
    assert root.stat().st_ino == root_ino
    assert len(fake.specs) == 1
    assert len([e for e in fake.execs if KILL_EXECS in e.argv]) == kills + 1
    assert "snapshot" in opened.ref.capabilities
    await ws.close()


async def test_unknown_version_kills_nothing(fake: FakeDockerEngine, tmp_root: str) -> None:
    opened = await _provider(fake, tmp_root).open(CONFIG, corral.SessionRef("s"))
    assert opened.workspace.snapshot is not None
    with pytest.raises(corral.OperationError) as info:
        await opened.workspace.snapshot.restore("snap-0000000000000000-00000000")
    assert info.value.code == "not_found"
    assert not [e for e in fake.execs if KILL_EXECS in e.argv]
    await opened.workspace.close()


async def test_gate_holds_commands_until_the_restore_ends() -> None:
    gate = CommandGate()
    await gate.wait()  # open: returns at once
    done = gate.close()
    passed = anyio.Event()

    async def command() -> None:
        await gate.wait()
        passed.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(command)
        await anyio.wait_all_tasks_blocked()
        assert not passed.is_set()
        gate.open(done)
    assert passed.is_set()


async def test_remote_engine_offers_snapshot_through_archives(tmp_root: str) -> None:
    fake = FakeDockerEngine(images=["corral-test:latest"], remote=True)
    provider = _provider(fake, tmp_root)
    assert "snapshot" in provider.capabilities
    opened = await provider.open(CONFIG, corral.SessionRef("s"), frozenset({"fs", "snapshot"}))
    assert isinstance(opened.workspace.snapshot, ArchiveSnapshotter)
    assert "snapshot" in opened.ref.capabilities
    with pytest.raises(corral.OperationError) as caught:
        await opened.workspace.snapshot.branch("snap-0000000000000000-00000000")
    assert caught.value.code == "not_found"
    await opened.workspace.close()
