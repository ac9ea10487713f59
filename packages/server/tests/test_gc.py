"""The blob collector on SQLite and PostgreSQL: what it removes, what it must keep, and SIGKILL.

The clock is passed in (``now=``), never waited for: "older than the grace
period" is arranged by moving the collection's start, not by sleeping.
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral.provider import ProcessRequest
from corral_server import LocalBlobStore, ServiceError, WorkspaceService
from corral_server._versions import decode
from server_support import ProcessMemoryProvider, make_service

pytestmark = pytest.mark.anyio

SANDBOX = {"provider": "in-memory", "capabilities": ["fs", "process"]}
GRACE = 3600.0
LATER = 3 * GRACE
"""Seconds ahead of the clock that make every blob written so far collectable."""
SKEW = 0.5
"""The collector's clock-skew margin where a test waits for a capture to expire."""


async def _write(service: WorkspaceService, project: str, ws: str, path: str, data: bytes) -> None:
    body = {"op": "write_file", "path": path, "data": base64.b64encode(data).decode()}
    await service.live_fs(project, ws, body)


async def _populate(service: WorkspaceService) -> tuple[str, str, str]:
    """Two workspaces with versions (and a handle archive); the second is deleted.

    Returns the project, the kept workspace and the deleted one.
    """
    await service.store.migrate()
    project, _ = await service.create_project("p1")
    keep = (await service.create(project, {"sandbox": SANDBOX})).id
    gone = (await service.create(project, {"sandbox": SANDBOX})).id
    await _write(service, project, keep, "a.txt", b"kept v1")
    await _write(service, project, keep, "shared.txt", b"in both workspaces")
    await service.take_version(project, keep)
    await _write(service, project, keep, "a.txt", b"kept v2")
    await service.start_process(project, keep, ProcessRequest(command="echo archived"), "exec")
    await service.stop(project, keep)
    await _write(service, project, gone, "b.txt", b"only in the deleted one")
    await _write(service, project, gone, "shared.txt", b"in both workspaces")
    await service.stop(project, gone)
    await service.delete(project, gone)
    return project, keep, gone


def _on_disk(blobs: LocalBlobStore) -> set[str]:
    return {d for d, _t in blobs.list()}


def _count(root: str) -> int:
    """Files under the blob root, without tidying anything (a collector may be running)."""
    return sum(len(os.listdir(os.path.join(root, d))) for d in os.listdir(root))


async def _assert_every_reference_readable(service: WorkspaceService) -> set[str]:
    """Every blob a version or handle references reads back whole; return them all."""
    fresh = LocalBlobStore(service.blobs.root)  # type: ignore[attr-defined]
    manifests, archives, _oldest = await service.store.blob_roots()
    seen = set(manifests) | archives
    for digest in manifests:
        for kind, _mode, _size, blob in decode(fresh.get(digest)).values():
            if kind == "file":
                fresh.get(blob)
                seen.add(blob)
    for digest in archives:
        fresh.get(digest)
    return seen


async def test_collects_exactly_the_unreferenced(tmp_path: Path, store_url: str) -> None:
    service = make_service(tmp_path, ProcessMemoryProvider(), url=store_url, gc_grace_s=GRACE)
    blobs = service.blobs
    assert isinstance(blobs, LocalBlobStore)
    project, keep, _gone = await _populate(service)
    before = _on_disk(blobs)
    # Within the grace period nothing goes, referenced or not.
    report = await service.collect_garbage()
    assert report.removed == 0
    assert _on_disk(blobs) == before
    # Later: exactly the blobs no version or handle references go.
    report = await service.collect_garbage(now=time.time() + LATER)
    referenced = await _assert_every_reference_readable(service)
    assert _on_disk(blobs) == referenced
    assert report.removed == len(before - referenced) > 0
    assert (await service.read_file(project, keep, "shared.txt")) == b"in both workspaces"
    assert (await service.read_file(project, keep, "a.txt")) == b"kept v2"
    # Pruning to the current version frees what only the older versions held.
    versions = await service.versions(project, keep)
    v1_only = blobs.put(b"kept v1")
    assert v1_only in referenced
    removed = await service.prune_versions(project, keep, 1)
    assert [v.id for v in versions if v.id not in removed] == [versions[-1].id]
    await service.collect_garbage(now=time.time() + LATER)
    assert v1_only not in _on_disk(blobs)
    assert _on_disk(blobs) == await _assert_every_reference_readable(service)
    assert (await service.read_file(project, keep, "a.txt")) == b"kept v2"
    with pytest.raises(ServiceError):
        await service.prune_versions(project, keep, 0)
    # The handle's archived output survived too.
    handles = await service.handles(project, keep)
    chunk = await service.read(
        project, keep, handles[0].id, stream="stdout", cursor=0, max_bytes=100, wait_s=0
    )
    assert chunk.data == b"archived\n"
    await service.store.aclose()


async def test_blobs_of_an_in_flight_version_are_kept(tmp_path: Path, store_url: str) -> None:
    """A version being taken has put blobs no row references yet; an old unreferenced
    blob it re-puts is refreshed. Both survive a collection that starts meanwhile."""
    service = make_service(tmp_path, ProcessMemoryProvider(), url=store_url, gc_grace_s=GRACE)
    blobs = service.blobs
    assert isinstance(blobs, LocalBlobStore)
    await service.store.migrate()
    old = blobs.put(b"unreferenced, about to be needed again")
    stale = blobs.put(b"unreferenced for good")
    ancient = time.time() - LATER
    for digest in (old, stale):
        os.utime(os.path.join(blobs.root, digest[:2], digest[2:]), (ancient, ancient))
    # The in-flight version: a new blob, and the old one put again (content-addressed).
    fresh = blobs.put(b"written by a capture still running")
    assert blobs.put(b"unreferenced, about to be needed again") == old
    report = await service.collect_garbage(now=time.time() + GRACE / 2)
    on_disk = _on_disk(blobs)
    assert {fresh, old} <= on_disk
    assert stale not in on_disk
    assert report.removed == 1
    await service.store.aclose()


class _Gate:
    """Makes the live box's ``read_file`` of ``/zz-slow`` wait: a capture stuck mid-way."""

    def __init__(self, service: WorkspaceService, ws: str) -> None:
        self.entered = anyio.Event()
        self.release = anyio.Event()
        fs = service._live[ws].workspace.fs
        real = fs.read_file

        async def read_file(path: str, **kw: Any) -> bytes:
            if path == "/zz-slow":
                self.entered.set()
                await self.release.wait()
            return await real(path, **kw)

        fs.read_file = read_file  # type: ignore[method-assign]


async def test_a_capture_longer_than_the_grace_commits_and_keeps_its_blobs(
    tmp_path: Path, store_url: str
) -> None:
    """A registered capture protects what it wrote however long it takes; the rest goes."""
    service = make_service(
        tmp_path, ProcessMemoryProvider(), url=store_url, gc_grace_s=0.05, lease_ttl_s=60.0
    )
    blobs = service.blobs
    await service.store.migrate()
    project, _ = await service.create_project("p1")
    ws = (await service.create(project, {"sandbox": SANDBOX})).id
    await _write(service, project, ws, "a.txt", b"first of the slow capture")
    await _write(service, project, ws, "zz-slow", b"the file it is stuck on")
    garbage = blobs.put(b"unreferenced, older than the capture")
    ancient = time.time() - LATER
    os.utime(os.path.join(blobs.root, garbage[:2], garbage[2:]), (ancient, ancient))  # type: ignore[attr-defined]
    gate = _Gate(service, ws)
    async with anyio.create_task_group() as tg:
        versions: list[str] = []

        async def take() -> None:
            versions.append((await service.take_version(project, ws)).id)

        tg.start_soon(take)
        await gate.entered.wait()
        written = hashlib.sha256(b"first of the slow capture").hexdigest()
        assert blobs.has(written)
        await anyio.sleep(0.2)  # longer than the grace: its first blob is "old" now
        report = await service.collect_garbage(now=time.time() + LATER)
        assert blobs.has(written)
        assert not blobs.has(garbage)
        assert report.removed == 1
        gate.release.set()
    # It committed, and everything it references is there after another collection.
    assert versions
    await service.collect_garbage(now=time.time() + LATER)
    await _assert_every_reference_readable(service)
    assert await service.read_file(project, ws, "a.txt") == b"first of the slow capture"
    assert await service.read_file(project, ws, "zz-slow") == b"the file it is stuck on"
    assert (await service.store.blob_roots())[2] is None  # no capture row left behind
    await service.store.aclose()


async def test_an_expired_capture_cannot_commit(tmp_path: Path, store_url: str) -> None:
    """A capture whose row expired (nothing renewed it) may have lost blobs: refused."""
    service = make_service(tmp_path, ProcessMemoryProvider(), url=store_url, lease_ttl_s=0.05)
    await service.store.migrate()
    project, _ = await service.create_project("p1")
    ws = (await service.create(project, {"sandbox": SANDBOX})).id
    await _write(service, project, ws, "zz-slow", b"x")
    before = (await service.get(project, ws)).current_version_id
    gate = _Gate(service, ws)
    async with anyio.create_task_group() as tg:

        async def take() -> None:
            with pytest.raises(ServiceError, match="expired"):
                await service.take_version(project, ws)

        tg.start_soon(take)
        await gate.entered.wait()
        await anyio.sleep(0.3)  # past its TTL; the renewer is not running
        assert (await service.store.blob_roots())[2] is None
        gate.release.set()
    assert (await service.get(project, ws)).current_version_id == before
    await service.store.aclose()


def test_collect_keeps_a_blob_put_during_its_check(tmp_path: Path) -> None:
    """``put`` refreshing the blob between the collector's decision and its removal wins."""
    blobs = LocalBlobStore(str(tmp_path / "blobs"))
    digest = blobs.put(b"contested")
    path = os.path.join(blobs.root, digest[:2], digest[2:])
    ancient = time.time() - LATER
    os.utime(path, (ancient, ancient))
    real_rename = os.rename

    def rename_then_put(src: str, dst: str) -> None:
        real_rename(src, dst)
        if dst.endswith(".trash"):  # the collector just set it aside: a put lands now
            os.utime(dst)  # what a put that saw the file a moment earlier did

    os.rename = rename_then_put  # type: ignore[assignment]
    try:
        assert blobs.collect(digest, time.time() - GRACE) is False
    finally:
        os.rename = real_rename
    assert blobs.get(digest) == b"contested"


@pytest.mark.slow
# The collector under test is a subprocess: one event loop for the harness is enough.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_sigkill_during_collection_loses_no_referenced_blob(
    tmp_path: Path, store_url: str
) -> None:
    service = make_service(tmp_path, ProcessMemoryProvider(), url=store_url, gc_grace_s=GRACE)
    blobs = service.blobs
    assert isinstance(blobs, LocalBlobStore)
    await _populate(service)
    ancient = time.time() - LATER
    for i in range(3000):  # enough garbage that a kill lands mid-sweep (no fsync: it is garbage)
        data = f"garbage {i}".encode()
        digest = hashlib.sha256(data).hexdigest()
        os.makedirs(os.path.join(blobs.root, digest[:2]), exist_ok=True)
        Path(blobs.root, digest[:2], digest[2:]).write_bytes(data)
    for path in Path(blobs.root).glob("*/*"):
        os.utime(path, (ancient, ancient))
    data = tmp_path / "srv"
    data.mkdir()
    argv = [
        sys.executable,
        "-m",
        "corral",
        "serve",
        "--data",
        str(data),
        "--store",
        store_url,
        "--blobs",
        blobs.root,
        "--gc",
        "--gc-grace",
        "60",
    ]
    rng = random.Random(18)
    killed_mid_way = 0
    for _ in range(4):
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        # Wait until it has begun removing, then kill at a random point.
        count = _count(blobs.root)
        deadline = time.monotonic() + 60
        while _count(blobs.root) == count and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.05))
        if proc.poll() is None:
            killed_mid_way += 1
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        await _assert_every_reference_readable(service)
    # A complete run afterwards leaves exactly the referenced blobs.
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    assert '"removed"' in done.stdout
    referenced = await _assert_every_reference_readable(service)
    assert _on_disk(blobs) == referenced
    assert killed_mid_way > 0
    await service.store.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_crashed_capture_stops_protecting_after_expiry(
    tmp_path: Path, store_url: str
) -> None:
    """SIGKILL a service mid-capture: its blobs are kept while its row lives, collected after."""
    service = make_service(tmp_path, ProcessMemoryProvider(), url=store_url, gc_grace_s=0.0)
    await service.store.migrate()
    blobs = service.blobs
    assert isinstance(blobs, LocalBlobStore)
    argv = [sys.executable, os.path.join(os.path.dirname(__file__), "capture_main.py")]
    proc = subprocess.Popen(
        [*argv, store_url, blobs.root], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"capturing\n"
        written = hashlib.sha256(b"written by a capture that crashes").hexdigest()
        await anyio.sleep(1.5)  # past one TTL: only its renewals keep the row live
        # A small margin: file times are coarser than the clock (the margin's other reason).
        await service.collect_garbage(now=time.time() + LATER, skew_s=SKEW)
        assert blobs.has(written)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    deadline = time.monotonic() + 30
    while (await service.store.blob_roots(skew_s=SKEW))[2] is not None:
        assert time.monotonic() < deadline, "a dead service's capture never expired"
        await anyio.sleep(0.1)
    await service.collect_garbage(now=time.time() + LATER, skew_s=SKEW)
    assert not blobs.has(written)
    assert _on_disk(blobs) == await _assert_every_reference_readable(service)
    await service.store.aclose()
