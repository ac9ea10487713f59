"""Helpers for testing code that uses corral: a ready tool context, recording sinks.

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

from ._mount import PathView
from ._observe import Event
from ._plugins import PluginSet, load_plugins
from ._protocols import WorkspaceProvider
from ._regex import Matcher, RegexEngine, RegexModuleEngine
from ._session import WorkspaceSession, open_workspace
from ._tool import SessionControl, ToolEnv
from ._toolset import _NoSessionControl

__all__ = [
    "LinesOnlyMatcher",
    "RecordingObserver",
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

    async def paths(self) -> PathView:
        return PathView()


def tool_env(
    policy: PolicyT,
    module: ModuleT,
    *,
    regex_engine: RegexEngine | None = None,
    session: SessionControl | None = None,
) -> ToolEnv[PolicyT, ModuleT]:
    """A :class:`corral.capability.ToolEnv` over a policy and a fake module: a handler alone.

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


EventT = TypeVar("EventT", bound=Event)


class RecordingObserver:
    """A synchronous event sink that remembers every event, for assertions.

    Pass it as ``observers=[recorder]`` to ``open_workspace`` or a registry.
    """

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        """Record."""
        self.events.append(event)

    def of_type(self, kind: type[EventT]) -> list[EventT]:
        """The recorded events of one class, in order."""
        return [e for e in self.events if isinstance(e, kind)]

    def names(self) -> list[str]:
        """The class names of the recorded events, in order."""
        return [type(e).__name__ for e in self.events]


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
