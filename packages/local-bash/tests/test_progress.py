"""Snapshot, restore and branch of a tree of a few thousand files report their progress."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import corral
import corral.sync
from corral.provider import Progress, ProviderConfig, SessionRef
from corral_local_bash import LocalBashProvider

FILES = 3000
DIRS = 30


class Recorder:
    """A thread-safe callback that keeps every report."""

    def __init__(self) -> None:
        self.seen: list[Progress] = []
        self._lock = threading.Lock()

    def __call__(self, progress: Progress) -> None:
        with self._lock:
            self.seen.append(progress)

    def of(self, operation: str) -> list[Progress]:
        return [p for p in self.seen if p.operation == operation]


def _fill(root: Path) -> int:
    """FILES files in DIRS directories; returns the number of entries below the root."""
    for d in range(DIRS):
        (root / f"d{d:02d}").mkdir()
    for i in range(FILES):
        (root / f"d{i % DIRS:02d}" / f"f{i:05d}.txt").write_text(f"file {i}\n")
    return DIRS + FILES


def check_monotonic_to_total(reports: list[Progress], total: int) -> None:
    assert reports, "no progress was reported"
    assert [p.done for p in reports] == sorted(p.done for p in reports)
    assert all(p.total in (None, total) for p in reports)
    assert all(p.unit == "entries" for p in reports)
    *running, last = reports
    assert not any(p.finished for p in running)
    assert last.finished
    assert last.done == last.total == total
    # Throttled: a few thousand entries in well under a second are a handful of reports.
    assert len(reports) < 50


@pytest.mark.anyio
async def test_tool_calls_report_snapshot_restore_and_branch(root: Path) -> None:
    record = Recorder()
    provider = LocalBashProvider(tmpdir_root=root)
    async with corral.open_workspace(
        provider, {"fs": True, "snapshot": True}, on_progress=record
    ) as ws:
        live = Path((await ws.workspace()).details()["root"])
        entries = _fill(live)
        snap = await ws.call("workspace_snapshot", {}, raise_on_error=True)
        check_monotonic_to_total(record.of("snapshot"), entries)
        assert record.of("snapshot")[0].total is None  # unknown until walked

        for i in range(0, FILES, 3):
            (live / f"d{i % DIRS:02d}" / f"f{i:05d}.txt").unlink()
        (live / "extra").mkdir()
        snapshot_id = snap.data["snapshot_id"]
        await ws.call("workspace_restore", {"snapshot_id": snapshot_id}, raise_on_error=True)
        restores = record.of("restore")
        check_monotonic_to_total(restores, entries)
        assert all(p.total == entries for p in restores)  # the version's size is known
        assert sum(1 for _ in live.rglob("*")) == entries

        await ws.call("workspace_branch", {"snapshot_id": snapshot_id}, raise_on_error=True)
        check_monotonic_to_total(record.of("branch"), entries)


@pytest.mark.anyio
async def test_module_users_pass_the_callback_as_a_keyword(
    make_provider: Callable[..., LocalBashProvider],
) -> None:
    opened = await make_provider().open(ProviderConfig("local-bash"), SessionRef("kw"))
    ws = opened.workspace
    snap = ws.snapshot
    assert snap is not None
    entries = _fill(Path(ws.details()["root"]))
    record = Recorder()
    info = await snap.snapshot("all", on_progress=record)  # type: ignore[call-arg]
    check_monotonic_to_total(record.of("snapshot"), entries)
    await snap.restore(info.snapshot_id, on_progress=record)  # type: ignore[call-arg]
    check_monotonic_to_total(record.of("restore"), entries)
    # Nobody listening: nothing is reported anywhere, and nothing breaks.
    before = len(record.seen)
    await snap.snapshot("quiet")
    assert len(record.seen) == before
    await ws.close()


@pytest.mark.anyio
async def test_a_raising_callback_never_breaks_the_snapshot(
    make_provider: Callable[..., LocalBashProvider], caplog: pytest.LogCaptureFixture
) -> None:
    calls = 0

    def broken(progress: Progress) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("the observer is broken")

    async with corral.open_workspace(
        make_provider(), {"fs": True, "snapshot": True}, on_progress=broken
    ) as ws:
        live = Path((await ws.workspace()).details()["root"])
        entries = _fill(live)
        with caplog.at_level(logging.WARNING, logger="corral.progress"):
            snap = await ws.call("workspace_snapshot", {})
            assert not snap.is_error, snap.content
            (live / "d00" / "f00000.txt").write_text("changed\n")
            restored = await ws.call("workspace_restore", {"snapshot_id": snap.data["snapshot_id"]})
            assert not restored.is_error, restored.content
        assert (live / "d00" / "f00000.txt").read_text() == "file 0\n"
        listed = await ws.call("workspace_ls", {"path": "/"})
        assert len(listed.data["entries"]) == DIRS
    assert calls == 2  # once per operation, then dropped
    assert sum("progress callback failed" in r.getMessage() for r in caplog.records) == 2
    assert entries == DIRS + FILES


def test_the_blocking_facade_takes_the_same_callback(root: Path) -> None:
    record = Recorder()
    with corral.sync.open_workspace(
        "local-bash",
        {"fs": True, "snapshot": True},
        provider_options={"tmpdir_root": os.fspath(root)},
        on_progress=record,
    ) as ws:
        ws.call("workspace_write_file", {"path": "/a.txt", "content": "a"})
        ws.call("workspace_snapshot", {})
    check_monotonic_to_total(record.of("snapshot"), 1)
