"""The store on SQLite and PostgreSQL: records, pagination, filters, scoping, leases, migrations."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral_server import ServiceError, WorkspaceService, open_store
from corral_server._store import MIGRATIONS
from server_support import ProcessMemoryProvider, make_service

pytestmark = pytest.mark.anyio

SANDBOX = {"provider": "in-memory", "capabilities": ["fs"]}


async def _service(tmp_path: Path, store_url: str) -> WorkspaceService:
    service = make_service(tmp_path, ProcessMemoryProvider(), url=store_url)
    await service.store.migrate()
    return service


async def test_migrations_are_versioned_and_idempotent(tmp_path: Path, store_url: str) -> None:
    store = open_store(store_url)
    assert await store.migrate() == len(MIGRATIONS)
    assert await store.migrate() == len(MIGRATIONS)
    await store.aclose()


async def test_crud_pagination_and_filters(tmp_path: Path, store_url: str) -> None:
    service = await _service(tmp_path, store_url)
    p1, _ = await service.create_project("p1")
    ids = []
    for i in range(7):
        rec = await service.create(
            p1, {"sandbox": SANDBOX, "tags": ["even" if i % 2 == 0 else "odd"]}
        )
        ids.append(rec.id)
    seen, after = [], None
    while True:
        page = await service.store.list_workspaces(p1, after=after, limit=3)
        seen += [r.id for r in page]
        if len(page) < 3:
            break
        after = page[-1].id
    assert seen == sorted(ids)
    evens = await service.store.list_workspaces(p1, tag="even")
    assert len(evens) == 4
    assert all(r.tags == ("even",) for r in evens)
    # Update replaces tags (and the tag index) and metadata.
    rec = await service.update(p1, ids[0], {"tags": ["odd"], "metadata": {"k": "v"}})
    assert rec.tags == ("odd",)
    assert rec.metadata == {"k": "v"}
    assert len(await service.store.list_workspaces(p1, tag="even")) == 3
    await service.archive(p1, ids[1])
    assert [r.id for r in await service.store.list_workspaces(p1, state="archived")] == [ids[1]]
    await service.delete(p1, ids[2])
    with pytest.raises(ServiceError) as err:
        await service.get(p1, ids[2])
    assert err.value.code == "not_found"
    await service.store.aclose()


async def test_another_projects_workspace_is_not_found(tmp_path: Path, store_url: str) -> None:
    service = await _service(tmp_path, store_url)
    a, _ = await service.create_project("a")
    b, _ = await service.create_project("b")
    ws = await service.create(a, {"sandbox": SANDBOX})
    for call in (service.get, service.delete, service.archive, service.connect, service.stop):
        with pytest.raises(ServiceError) as err:
            await call(b, ws.id)
        assert err.value.code == "not_found"
    with pytest.raises(ServiceError):
        await service.read_file(b, ws.id, "/x")
    assert await service.store.list_workspaces(b) == []
    await service.store.aclose()


async def test_tokens_are_stored_hashed(tmp_path: Path, store_url: str) -> None:
    service = await _service(tmp_path, store_url)
    project, token = await service.create_project("p")
    assert await service.authenticate(token) == project
    for bad in (None, "", "crl_nope", token + "x", "x" * 300):
        with pytest.raises(ServiceError) as err:
            await service.authenticate(bad)
        assert err.value.code == "unauthenticated"
    row = await service.store.token_project(
        __import__("hashlib").sha256(token.encode()).hexdigest()
    )
    assert row is not None
    assert token not in row[0]
    await service.store.aclose()


async def test_lease_one_holder_until_expiry(tmp_path: Path, store_url: str) -> None:
    store = open_store(store_url)
    await store.migrate()
    a = await store.acquire_lease("ws-1", "A", 0.5)
    assert a.holder == "A"
    assert (await store.acquire_lease("ws-1", "B", 0.5)).holder == "A"
    assert (await store.acquire_lease("ws-1", "A", 0.5)).holder == "A"  # renewal
    await anyio.sleep(0.6)
    assert (await store.acquire_lease("ws-1", "B", 0.5)).holder == "B"  # expired: taken over
    assert await store.set_lease_ref("ws-1", "A", "{}") is False
    await store.aclose()


async def test_lease_race_has_one_winner(tmp_path: Path, store_url: str) -> None:
    stores = [open_store(store_url) for _ in range(4)]
    await stores[0].migrate()
    winners: list[str] = []

    async def grab(i: int) -> None:
        lease = await stores[i % 4].acquire_lease("ws-race", f"H{i}", 60)
        winners.append(lease.holder)

    async with anyio.create_task_group() as tg:
        for i in range(16):
            tg.start_soon(grab, i)
    assert len(set(winners)) == 1
    for s in stores:
        await s.aclose()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    import sqlite3

    path = str(tmp_path / "s.db")
    store = open_store(path)
    anyio.run(store.migrate)
    anyio.run(store.aclose)
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO schema_migrations VALUES (?, ?)", (len(MIGRATIONS) + 1, time.time()))
    conn.commit()
    conn.close()
    store = open_store(path)
    with pytest.raises(ServiceError, match="newer"):
        anyio.run(store.migrate)
    anyio.run(store.aclose)


@pytest.mark.postgres
async def test_a_dropped_connection_is_replaced(pg_cluster: Any) -> None:
    import psycopg

    url = pg_cluster.new_database()
    store = open_store(url)
    await store.migrate()
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    with pytest.raises(psycopg.OperationalError):
        await store.project_by_name("x")  # the call that finds the connection dead
    assert await store.project_by_name("x") is None  # a fresh connection
    await store.aclose()
