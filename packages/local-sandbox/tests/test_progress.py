"""A real sandboxed workspace reports snapshot and restore progress through its tools."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import corral
from corral.provider import Progress
from corral_local_sandbox import LocalSandboxProvider

ENTRIES = 1000


@pytest.mark.bwrap
@pytest.mark.anyio
async def test_snapshot_and_restore_report_progress_in_the_sandbox(tmp_path: Path) -> None:
    seen: list[Progress] = []
    lock = threading.Lock()

    def record(progress: Progress) -> None:
        with lock:
            seen.append(progress)

    provider = LocalSandboxProvider(tmpdir_root=str(tmp_path))
    async with corral.open_workspace(
        provider, {"fs": True, "shell": True, "snapshot": True}, on_progress=record
    ) as ws:
        made = await ws.call(
            "workspace_run",
            {"command": f"mkdir d && for i in $(seq {ENTRIES - 1}); do echo $i > d/$i; done"},
        )
        assert not made.is_error, made.content
        assert made.data["exit_code"] == 0, made.content
        snap = await ws.call("workspace_snapshot", {}, raise_on_error=True)
        await ws.call("workspace_run", {"command": "rm -r d"}, raise_on_error=True)
        await ws.call(
            "workspace_restore", {"snapshot_id": snap.data["snapshot_id"]}, raise_on_error=True
        )
        listed = await ws.call("workspace_ls", {"path": "/d"}, raise_on_error=True)
        assert len(listed.data["entries"]) == ENTRIES - 1
    for operation in ("snapshot", "restore"):
        reports = [p for p in seen if p.operation == operation]
        assert reports, operation
        assert [p.done for p in reports] == sorted(p.done for p in reports)
        *running, last = reports
        assert not any(p.finished for p in running)
        assert last.finished
        # The sandbox may add its own entries (protected paths); the count is the tree's.
        assert last.done == last.total
        assert last.done >= ENTRIES
