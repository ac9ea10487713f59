"""Fixtures: a service on SQLite (and PostgreSQL when available) and a real server on loopback."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # the helper module next to this file

from corral_server import AsyncClient, WorkspaceService
from server_support import (
    REQUIRE_POSTGRES,
    PostgresCluster,
    ProcessMemoryProvider,
    make_service,
    running,
)


@pytest.fixture
def provider() -> ProcessMemoryProvider:
    """The in-memory provider with a fake ``process`` module."""
    return ProcessMemoryProvider()


@pytest.fixture
async def api(
    tmp_path: Path, provider: ProcessMemoryProvider
) -> AsyncIterator[tuple[WorkspaceService, AsyncClient]]:
    """A running server on SQLite and a client of project ``p1``."""
    service = make_service(tmp_path, provider)
    async with running(service) as (url, token), AsyncClient(url, token) as client:
        yield service, client
    await service.store.aclose()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    """A private PostgreSQL cluster for the session (fails instead of skipping when required)."""
    try:
        cluster = PostgresCluster()
    except Exception as exc:
        if REQUIRE_POSTGRES:
            pytest.fail(f"CORRAL_REQUIRE_POSTGRES=1 but PostgreSQL cannot start: {exc}")
        pytest.skip(f"PostgreSQL is not available: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database URL of each engine."""
    if request.param == "sqlite":
        return str(tmp_path / "state.db")
    cluster: PostgresCluster = request.getfixturevalue("pg_cluster")
    return cluster.new_database()
