"""A process that opened a workspace is killed; another process resolves the persisted ref."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import anyio
import pytest

from corral import ref_from_json
from corral_local_bash import LocalBashProvider

CHILD = """
import sys, anyio
from corral import ProviderConfig, SessionRef, ref_to_json
from corral_local_bash import LocalBashProvider

async def main():
    provider = LocalBashProvider(tmpdir_root=sys.argv[1])
    opened = await provider.open(ProviderConfig("local-bash"), SessionRef("crash/1"))
    ws = opened.workspace
    await ws.fs.write_file("/data/before.txt", b"snapshotted")
    info = await ws.snapshot.snapshot("pre-crash")
    await ws.fs.write_file("/data/after.txt", b"written after the snapshot")
    print(info.snapshot_id, ref_to_json(opened.ref), flush=True)
    await anyio.sleep(120)

anyio.run(main)
"""


@pytest.mark.anyio
async def test_killed_process_leaves_a_resolvable_workspace(root: Path) -> None:
    async with await anyio.open_process([sys.executable, "-c", CHILD, str(root)]) as proc:
        assert proc.stdout is not None
        line = b""
        with anyio.fail_after(60):
            while not line.endswith(b"\n"):
                line += await proc.stdout.receive()
        proc.send_signal(signal.SIGKILL)
        assert await proc.wait() == -signal.SIGKILL
    snapshot_id, ref_json = line.decode().strip().split(" ", 1)

    provider = LocalBashProvider(tmpdir_root=root)
    ws = await provider.resolve(ref_from_json(ref_json))
    assert ws.fs is not None
    assert ws.snapshot is not None
    assert await ws.fs.read_file("/data/before.txt") == b"snapshotted"
    assert await ws.fs.read_file("/data/after.txt") == b"written after the snapshot"
    assert [(s.snapshot_id, s.label) for s in await ws.snapshot.list()] == [
        (snapshot_id, "pre-crash")
    ]
    await ws.snapshot.restore(snapshot_id)
    assert [e.name for e in await ws.fs.ls("/data")] == ["before.txt"]
    await ws.close()
