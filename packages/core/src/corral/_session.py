"""``open_workspace``: the one-call entry point for the common case."""

from __future__ import annotations

import functools
import os
import secrets
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal

from ._data import ProviderConfig, SessionRef, WorkspaceConfig, WorkspaceRef
from ._errors import ConfigError
from ._observe import UsageRecorder, WorkspaceMetrics
from ._plugins import BLOCK_ENV, PluginSet, load_plugins
from ._protocols import WorkspaceProvider
from ._regex import RegexEngine
from ._registry import PersistRef, ScopedWorkspace, WorkspaceRegistry
from ._tool import Tool, ToolResult
from ._toolset import ResultFilter, WorkspaceToolset

__all__ = ["WorkspaceSession", "default_plugins", "default_provider_kind", "open_workspace"]

PREFERRED_DEFAULTS = ("local-bash", "in-memory")


@functools.cache
def _cached_plugins(blocked: str) -> PluginSet:
    return load_plugins(blocked=blocked.split(","))


def default_plugins() -> PluginSet:
    """The installed plugin set, loaded once per process (and per block list)."""
    return _cached_plugins(os.environ.get(BLOCK_ENV, ""))


class WorkspaceSession:
    """A session's workspace and its tools, as ``open_workspace`` yields it."""

    def __init__(self, registry: WorkspaceRegistry, toolset: WorkspaceToolset) -> None:
        self.registry = registry
        self.toolset = toolset

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The ``workspace_*`` tools."""
        return self.toolset.tools

    @property
    def ref(self) -> WorkspaceRef | None:
        """The current ref (after the first open)."""
        return self.registry.ref

    async def call(self, name: str, arguments: object = None) -> ToolResult:
        """Call a tool by name with the model's arguments."""
        return await self.toolset.call(name, arguments)

    async def workspace(self) -> ScopedWorkspace:
        """The typed workspace (declared modules only), opening it if needed."""
        return await self.registry.get()

    def openai_tools(self) -> list[dict[str, Any]]:
        """OpenAI function specs of the tools."""
        return self.toolset.openai_tools()

    def anthropic_tools(self) -> list[dict[str, Any]]:
        """Anthropic tool specs of the tools."""
        return self.toolset.anthropic_tools()


def resolve_provider(
    provider: str | WorkspaceProvider,
    plugins: PluginSet,
    provider_options: Mapping[str, Any] | None = None,
) -> WorkspaceProvider:
    """A provider instance from a kind (through the plugins) or as given."""
    if isinstance(provider, str):
        return plugins.provider(provider).create(provider_options)
    if provider_options:
        raise ConfigError("provider_options only apply when the provider is given by kind")
    return provider


def default_provider_kind(plugins: PluginSet) -> str:
    """The embedded default provider: local-bash when installed (its workspaces
    outlive the process, which ``corral call`` and ``corral mcp --keep`` need),
    else in-memory, else the first installed kind.

    Raises:
        ConfigError: No provider is installed.
    """
    for kind in PREFERRED_DEFAULTS:
        if kind in plugins.providers:
            return kind
    if plugins.providers:
        return sorted(plugins.providers)[0]
    raise ConfigError("no workspace provider is installed: pip install corral-local-bash")


def default_capabilities(provider: WorkspaceProvider, plugins: PluginSet) -> dict[str, Any]:
    """Every capability the provider supports that a plugin defines, with defaults."""
    return {name: True for name in sorted(provider.capabilities) if name in plugins.capabilities}


@asynccontextmanager
async def open_workspace(
    provider: str | WorkspaceProvider,
    capabilities: Mapping[str, Any] | None = None,
    *,
    session_id: str | None = None,
    provider_options: Mapping[str, Any] | None = None,
    config_options: Mapping[str, Any] | None = None,
    ref: WorkspaceRef | None = None,
    persist_ref: PersistRef | None = None,
    open_strategy: Literal["lazy", "eager"] = "lazy",
    close_on_exit: bool = True,
    plugins: PluginSet | None = None,
    regex_engine: RegexEngine | None = None,
    usage: UsageRecorder | None = None,
    trace_context: Mapping[str, str] | None = None,
    result_filter: ResultFilter | None = None,
    metrics: WorkspaceMetrics | None = None,
    hooks: Iterable[object] = (),
    transient_retry_attempts: int = 3,
    close_timeout_s: float = 30.0,
    reset_after_s: float | None = None,
) -> AsyncIterator[WorkspaceSession]:
    """Open a session's workspace with its tools; close it on exit.

    Example::

        async with open_workspace("local-bash", {"fs": True, "shell": True}) as ws:
            await ws.call("workspace_write_file", {"path": "/a.txt", "content": "hi"})
            print((await ws.call("workspace_run", {"command": "cat a.txt"})).content)

    Args:
        provider: A provider kind (found through the installed plugins) or instance.
        capabilities: Capability config (``{"fs": True, "shell": {...}}``);
            None declares every capability the provider supports.
        session_id: The session's id (random when omitted).
        provider_options: Keyword options of the provider factory (kind only).
        config_options: Per-session provider options (``ProviderConfig.options``).
        ref: Resume this workspace instead of opening a new one.
        persist_ref: Called with each new ref and None after close.
        open_strategy: ``eager`` opens before yielding, so failures surface now.
        close_on_exit: Close the workspace on exit (False keeps it for a later resume).
        plugins: The plugin set (default: the installed plugins).
        regex_engine, usage, trace_context, result_filter: See WorkspaceToolset.
        metrics, hooks, transient_retry_attempts, close_timeout_s, reset_after_s:
            See WorkspaceRegistry.

    Raises:
        ConfigError: Unknown provider kind or capability, or a bad option.
        WorkspaceFailedError: With ``open_strategy="eager"``, the open failed.
    """
    plugins = plugins or default_plugins()
    instance = resolve_provider(provider, plugins, provider_options)
    if capabilities is None:
        capabilities = default_capabilities(instance, plugins)
    config = WorkspaceConfig(
        provider=ProviderConfig(instance.provider_id, dict(config_options or {})),
        capabilities=capabilities,
    )
    session = SessionRef(session_id or f"session-{secrets.token_hex(6)}")
    registry = WorkspaceRegistry(
        config,
        session,
        instance,
        ref=ref,
        persist_ref=persist_ref,
        transient_retry_attempts=transient_retry_attempts,
        close_timeout_s=close_timeout_s,
        reset_after_s=reset_after_s,
        metrics=metrics,
        hooks=hooks,
    )
    toolset = WorkspaceToolset(
        registry,
        plugins.capabilities,
        regex_engine=regex_engine,
        usage=usage,
        trace_context=trace_context,
        result_filter=result_filter,
        owns_registry=close_on_exit,
    )
    async with registry.hooks_running():
        try:
            if open_strategy == "eager":
                await registry.get()
            yield WorkspaceSession(registry, toolset)
        finally:
            await toolset.aclose()
