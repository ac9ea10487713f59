"""Fixtures for the corral-isolate tests (helpers are fixtures: tests cannot import this)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import corral
import corral.provider
from corral_isolate import IsolateProvider

Run = Callable[..., Awaitable[corral.ExecResult]]


@pytest.fixture
def provider() -> IsolateProvider:
    """A provider with a small output cap, so caps are cheap to reach."""
    return IsolateProvider(max_output_bytes=1000, memory_bytes=32 << 20)


@pytest.fixture
async def runner(provider: IsolateProvider) -> AsyncIterator[corral.provider.CodeInterpreter]:
    """The script module of an open workspace, closed afterwards."""
    opened = await provider.open(
        corral.ProviderConfig("isolate"), corral.SessionRef("test"), frozenset({"script"})
    )
    script = opened.workspace.script
    assert script is not None
    yield script
    await opened.workspace.close()


@pytest.fixture
def run(runner: corral.provider.CodeInterpreter) -> Run:
    """Runs JavaScript with a 10 s timeout unless told otherwise."""

    async def go(code: str, timeout_s: float = 10.0) -> corral.ExecResult:
        return await runner.run_code("javascript", code, timeout_s=timeout_s)

    return go
