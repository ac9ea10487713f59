"""Fixtures shared by the corral-memory tests (helpers are fixtures: tests cannot import this)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import corral
import corral.provider
from corral_memory import InMemoryProvider

Snapshot = Callable[[corral.provider.FileSystem], Awaitable[dict[str, bytes | None]]]


async def _tree_of(fs: corral.provider.FileSystem) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for path in await fs.glob("**"):
        st = await fs.stat(path)
        out[path] = await fs.read_file(path) if st.type == "file" else None
    return out


@pytest.fixture
def tree_of() -> Snapshot:
    """Returns every entry of a workspace: file paths to bytes, directories to None."""
    return _tree_of


@pytest.fixture
def config() -> corral.ProviderConfig:
    """The provider config of an in-memory workspace."""
    return corral.ProviderConfig(kind="in-memory")


@pytest.fixture
def session() -> corral.SessionRef:
    """A session ref."""
    return corral.SessionRef(session_id="s1")


@pytest.fixture
def compile_pattern() -> Callable[..., corral.provider.Matcher]:
    """Compiles a real matcher with core's default engine."""
    engine = corral.RegexModuleEngine()
    return engine.compile


@pytest.fixture
def provider() -> InMemoryProvider:
    """A provider with default limits."""
    return InMemoryProvider()


@pytest.fixture
async def opened(
    provider: InMemoryProvider,
    config: corral.ProviderConfig,
    session: corral.SessionRef,
    anyio_backend: str,
) -> AsyncIterator[corral.provider.OpenedWorkspace]:
    """An open workspace with fs and snapshot, closed after the test."""
    result = await provider.open(config, session)
    yield result
    await result.workspace.close()


@pytest.fixture
def fs(opened: corral.provider.OpenedWorkspace) -> corral.provider.FileSystem:
    """The fs module of the open workspace."""
    assert opened.workspace.fs is not None
    return opened.workspace.fs


@pytest.fixture
def snap(opened: corral.provider.OpenedWorkspace) -> corral.provider.Snapshotter:
    """The snapshot module of the open workspace."""
    assert opened.workspace.snapshot is not None
    return opened.workspace.snapshot
