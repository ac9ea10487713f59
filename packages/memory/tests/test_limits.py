"""Byte budgets: per-file and per-workspace limits, and atomicity when they bite."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import corral
import corral.provider
from corral_memory import ENTRY_OVERHEAD, InMemoryProvider

pytestmark = pytest.mark.anyio

BUDGET = 10_000


async def _code(awaitable: object) -> str:
    with pytest.raises(corral.OperationError) as info:
        await awaitable  # type: ignore[misc]
    return info.value.code


@pytest.fixture
async def small(
    config: corral.ProviderConfig, anyio_backend: str
) -> AsyncIterator[corral.provider.OpenedWorkspace]:
    """A workspace with a 10 kB budget and a 4 kB file cap."""
    provider = InMemoryProvider(max_workspace_bytes=BUDGET, max_file_bytes=4000)
    opened = await provider.open(config, corral.SessionRef("small"))
    yield opened
    await opened.workspace.close()


def _fs(opened: corral.provider.OpenedWorkspace) -> corral.provider.FileSystem:
    assert opened.workspace.fs is not None
    return opened.workspace.fs


def _used(opened: corral.provider.OpenedWorkspace) -> int:
    return int(corral.provider.describe_workspace(opened.workspace)["used_bytes"])


async def test_file_cap(small: corral.provider.OpenedWorkspace) -> None:
    fs = _fs(small)
    await fs.write_file("/ok", b"x" * 4000)
    assert await _code(fs.write_file("/big", b"x" * 4001)) == "too_large"
    assert await _code(fs.stat("/big")) == "not_found"


async def test_edit_beyond_file_cap_leaves_file_alone(
    small: corral.provider.OpenedWorkspace,
) -> None:
    fs = _fs(small)
    await fs.write_file("/f", b"ab" * 1000)
    assert await _code(fs.edit_file("/f", "a", "aaaa", replace_all=True)) == "too_large"
    assert await fs.read_file("/f") == b"ab" * 1000


async def test_workspace_budget(small: corral.provider.OpenedWorkspace) -> None:
    fs = _fs(small)
    await fs.write_file("/1", b"x" * 4000)
    await fs.write_file("/2", b"x" * 4000)
    before = _used(small)
    assert await _code(fs.write_file("/3", b"x" * 4000)) == "too_large"
    assert _used(small) == before
    # Shrinking is always allowed, and freed bytes can be used again.
    await fs.write_file("/2", b"")
    await fs.write_file("/3", b"x" * 3000)
    await fs.rm("/1")
    await fs.write_file("/4", b"x" * 4000)


async def test_budget_failure_creates_no_parents(small: corral.provider.OpenedWorkspace) -> None:
    fs = _fs(small)
    await fs.write_file("/fill", b"x" * 4000)
    await fs.write_file("/fill2", b"x" * 4000)
    assert await _code(fs.write_file("/p/q/r/big", b"x" * 3000)) == "too_large"
    assert await _code(fs.stat("/p")) == "not_found"
    # 8521 bytes in use: five one-letter directories (5 * 257) fit, six do not.
    assert await _code(fs.mkdir("/m/n/o/p/q/r", parents=True)) == "too_large"
    assert await _code(fs.stat("/m")) == "not_found"
    await fs.mkdir("/m/n/o/p/q", parents=True)


async def test_empty_entries_are_charged(small: corral.provider.OpenedWorkspace) -> None:
    fs = _fs(small)
    made = 0
    code = ""
    while not code:
        try:
            await fs.write_file(f"/e{made}", b"")
            made += 1
        except corral.OperationError as exc:
            code = exc.code
    assert code == "too_large"
    # Ten names of two bytes (258 each), then 28 of three bytes (259 each).
    assert made == 38
    assert await _code(fs.mkdir("/one-more-dir")) == "too_large"
    assert _used(small) <= BUDGET


async def test_budget_counts_names(small: corral.provider.OpenedWorkspace) -> None:
    fs = _fs(small)
    await fs.write_file("/abc", b"12")
    assert _used(small) == ENTRY_OVERHEAD + 3 + 2
    await fs.mkdir("/dir")
    assert _used(small) == 2 * ENTRY_OVERHEAD + 6 + 2


async def test_branch_keeps_the_limits(small: corral.provider.OpenedWorkspace) -> None:
    snap = small.workspace.snapshot
    assert snap is not None
    info = await snap.snapshot()
    branch = await InMemoryProvider().resolve(await snap.branch(info.snapshot_id))
    assert branch.fs is not None
    assert await _code(branch.fs.write_file("/big", b"x" * 4001)) == "too_large"
    await branch.close()
