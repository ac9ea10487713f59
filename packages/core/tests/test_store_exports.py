"""The session store and the scripted demo (the public surface: test_exports.py)."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

import corral
import corral.testing
from corral import RefStore, WorkspaceFailedError, WorkspaceRef

pytestmark = pytest.mark.anyio


async def test_store_round_trip(tmp_path: Path) -> None:
    store = RefStore(tmp_path / "state" / "s.db")
    ref = WorkspaceRef("local-bash", {"dir": "ws-1"}, {"fs", "shell"}, 2)
    await store.save("s1", "local-bash", ref, capabilities={"fs": True}, provider_options={"a": 1})
    loaded = await store.load("s1")
    assert loaded is not None
    assert loaded.ref == ref
    assert loaded.capabilities == {"fs": True}
    assert loaded.provider_options == {"a": 1}
    assert [s.session_id for s in await store.sessions()] == ["s1"]
    assert stat.S_IMODE((tmp_path / "state" / "s.db").stat().st_mode) == 0o600
    assert await store.delete("s1") is True
    assert await store.load("s1") is None
    assert await store.delete("s1") is False


async def test_tampered_store_row_is_rejected_cleanly(tmp_path: Path) -> None:
    store = RefStore(tmp_path / "s.db")
    await store.save("s1", "local-bash", WorkspaceRef("local-bash", {}, {"fs"}, 2))
    with sqlite3.connect(tmp_path / "s.db") as conn:
        conn.execute(
            "UPDATE sessions SET ref_json = ?", ('{"provider_id": "x", "payload": "<<EVIL>>"}',)
        )
    with pytest.raises(WorkspaceFailedError) as info:
        await store.load("s1")
    assert "<<EVIL>>" not in str(info.value)


async def test_demo_on_in_memory_completes() -> None:
    from corral._demo import run_demo

    lines: list[str] = []
    status = await run_demo("in-memory", corral.load_plugins(), echo=lines.append)
    assert status == 0
    assert lines[-1] == "agent finished: completed"
    restored = lines.index(next(line for line in lines if "workspace_restore" in line))
    assert "corral keeps files safe for you" in "\n".join(lines[restored:])
