"""Helpers for testing code that uses corral: a ready tool context, no-op sinks.

Example::

    async def test_my_tool():
        async with corral.testing.workspace_context(InMemoryProvider()) as ctx:
            await ctx.call("workspace_write_file", {"path": "/a", "content": "x"})
            ws = await ctx.workspace()
            assert await ws.require("fs").read_file("/a") == b"x"
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

from attrs import AttrsInstance

from ._observe import NoopMetrics, WorkspaceEvent
from ._plugins import PluginSet, load_plugins
from ._protocols import WorkspaceProvider
from ._regex import Matcher, RegexEngine, RegexModuleEngine
from ._session import WorkspaceSession, open_workspace
from ._tool import SessionControl, ToolEnv
from ._toolset import _NoSessionControl

__all__ = [
    "LinesOnlyMatcher",
    "NoopHooks",
    "NoopMetrics",
    "RecordingHooks",
    "RecordingUsage",
    "noop_logger",
    "tool_env",
    "workspace_context",
]


class LinesOnlyMatcher:
    """A matcher exposing only the protocol's ``search_lines``.

    corral's own matchers also have a prefiltered ``search_bytes`` fast path;
    wrapping one in this proves a provider's grep still works (and agrees)
    through the plain protocol, as it must for third-party matchers.
    """

    def __init__(self, inner: Matcher) -> None:
        self._inner = inner

    @property
    def pattern(self) -> str:
        """The source pattern."""
        return self._inner.pattern

    def search_lines(self, text: str, limit: int) -> list[tuple[int, str]]:
        """Delegate to the wrapped matcher's text search."""
        return self._inner.search_lines(text, limit)


PolicyT = TypeVar("PolicyT", bound=AttrsInstance)
ModuleT = TypeVar("ModuleT")


class _StaticToolEnv(Generic[PolicyT, ModuleT]):
    __slots__ = ("_module", "policy", "regex_engine", "session")

    def __init__(
        self,
        policy: PolicyT,
        module: ModuleT,
        regex_engine: RegexEngine,
        session: SessionControl,
    ) -> None:
        self.policy = policy
        self._module = module
        self.regex_engine = regex_engine
        self.session = session

    async def module(self) -> ModuleT:
        return self._module


def tool_env(
    policy: PolicyT,
    module: ModuleT,
    *,
    regex_engine: RegexEngine | None = None,
    session: SessionControl | None = None,
) -> ToolEnv[PolicyT, ModuleT]:
    """A :class:`corral.ToolEnv` over a policy and a (fake) module, to test a handler alone.

    ``await handler(tool_env(MyPolicy(), FakeModule()), MyArgs(...))`` runs one
    tool's logic without a provider, registry or toolset. Without ``session``,
    ``env.session`` refuses as it does for a capability that did not ask for it.
    """
    return _StaticToolEnv(
        policy,
        module,
        regex_engine or RegexModuleEngine(),
        session if session is not None else _NoSessionControl("test"),
    )


def noop_logger() -> logging.Logger:
    """A logger that drops everything."""
    logger = logging.getLogger("corral.testing.noop")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


class NoopHooks:
    """Hooks that do nothing (the registry's default is no hooks at all)."""


class RecordingHooks:
    """Synchronous hooks that remember every event, for assertions."""

    def __init__(self) -> None:
        self.events: list[WorkspaceEvent] = []

    def on_open(self, event: WorkspaceEvent) -> None:
        """Record."""
        self.events.append(event)

    def on_close(self, event: WorkspaceEvent) -> None:
        """Record."""
        self.events.append(event)

    def on_evicted(self, event: WorkspaceEvent) -> None:
        """Record."""
        self.events.append(event)

    def on_eviction_retry(self, event: WorkspaceEvent) -> None:
        """Record."""
        self.events.append(event)

    def on_snapshot(self, event: WorkspaceEvent) -> None:
        """Record."""
        self.events.append(event)

    def names(self) -> list[str]:
        """The hook names in order."""
        return [e.hook for e in self.events]


class RecordingUsage:
    """A usage recorder that remembers ``(kind, duration_ms, session_id)``."""

    def __init__(self) -> None:
        self.records: list[tuple[str, float, str]] = []

    def __call__(self, kind: str, duration_ms: float, *, session_id: str) -> None:
        """Record."""
        self.records.append((kind, duration_ms, session_id))


@asynccontextmanager
async def workspace_context(
    provider: WorkspaceProvider | str,
    capabilities: Mapping[str, Any] | None = None,
    *,
    plugins: PluginSet | None = None,
    **kwargs: Any,
) -> AsyncIterator[WorkspaceSession]:
    """A session with tools over ``provider``; ``capabilities`` default to ``{"fs": True}``."""
    async with open_workspace(
        provider,
        capabilities if capabilities is not None else {"fs": True},
        plugins=plugins or load_plugins(),
        **kwargs,
    ) as session:
        yield session
