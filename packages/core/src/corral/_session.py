"""``open_workspace``: the one-call entry point for the common case."""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal, cast

from ._bridges import AnthropicTool, OpenAIResponsesTool, OpenAITool
from ._data import ExecResult, ProviderConfig, SessionRef, WorkspaceConfig, WorkspaceRef
from ._errors import ConfigError, OperationError, WorkspaceError
from ._mount import workspace_path_of
from ._observe import EventSink, MetricsSink, UsageRecorder, UsageSink, WorkspaceMetrics
from ._plugins import BLOCK_ENV, PluginSet, load_plugins
from ._policies import ProcessPolicy
from ._process import ProcessManager
from ._progress import ProgressCallback, reporting_progress
from ._protocols import WorkspaceProvider
from ._regex import RegexEngine
from ._registry import PersistRef, ScopedWorkspace, WorkspaceRegistry
from ._streaming import (
    CommandStream,
    OutputCallback,
    code_command,
    run_with_callback,
    stream_request,
)
from ._tool import Tool, ToolResult
from ._toolset import ResultFilter, WorkspaceToolset

__all__ = [
    "ToolCallError",
    "WorkspaceSession",
    "default_plugins",
    "default_provider_kind",
    "open_workspace",
]

PREFERRED_DEFAULTS = ("local-bash", "in-memory")


@functools.cache
def _cached_plugins(blocked: str) -> PluginSet:
    return load_plugins(blocked=blocked.split(","))


def default_plugins() -> PluginSet:
    """The installed plugin set, loaded once per process (and per block list)."""
    return _cached_plugins(os.environ.get(BLOCK_ENV, ""))


class ToolCallError(WorkspaceError):
    """A tool call failed, raised for library code that asked for exceptions.

    The model never sees this: agent loops pass the error :class:`ToolResult`
    back to it. Library code that calls tools itself (a script, a test, a
    pipeline step) usually wants a failure to stop it where it happened rather
    than to find ``result.data`` is None later.

    Attributes:
        tool: The tool's name.
        code: The result's ``error_code`` (``not_found``, ``policy_denied``,
            ``workspace_failed``...).
        result: The full error result.
    """

    def __init__(self, tool: str, result: ToolResult) -> None:
        self.tool = tool
        self.code = result.error_code or "failed"
        self.result = result
        super().__init__(f"{tool} failed ({self.code}): {result.content}")


class WorkspaceSession:
    """A session's workspace and its tools, as ``open_workspace`` yields it.

    Args:
        registry: The session's registry.
        toolset: Its tools.
        raise_on_error: Default of :meth:`call`'s ``raise_on_error``.
    """

    def __init__(
        self,
        registry: WorkspaceRegistry,
        toolset: WorkspaceToolset,
        *,
        raise_on_error: bool = False,
    ) -> None:
        self.registry = registry
        self.toolset = toolset
        self.raise_on_error = raise_on_error

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The ``workspace_*`` tools."""
        return self.toolset.tools

    @property
    def ref(self) -> WorkspaceRef | None:
        """The current ref (after the first open)."""
        return self.registry.ref

    async def call(
        self,
        name: str,
        arguments: object = None,
        *,
        raise_on_error: bool | None = None,
        strict: bool = False,
    ) -> ToolResult:
        """Call a tool by name with the model's arguments.

        Args:
            name: The tool's name (``workspace_read_file``).
            arguments: Its arguments, as the model would send them.
            raise_on_error: Raise :class:`ToolCallError` instead of returning an
                error result (default: the session's ``raise_on_error``). Keep
                it off on the path that feeds results back to a model.
            strict: Also accept the strict-mode form of the arguments, as a
                model shown :meth:`openai_tools` ``(strict=True)`` sends them.

        Raises:
            ToolCallError: The call failed and ``raise_on_error`` is on.
        """
        result = await self.toolset.call(name, arguments, strict=strict)
        raising = self.raise_on_error if raise_on_error is None else raise_on_error
        if raising and result.is_error:
            raise ToolCallError(name, result)
        return result

    async def workspace(self) -> ScopedWorkspace:
        """The typed workspace (declared modules only), opening it if needed."""
        if self.toolset.on_progress is None:
            return await self.registry.get()
        with reporting_progress(self.toolset.on_progress):
            return await self.registry.get()

    async def stream(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        max_output_bytes: int = 1_000_000,
    ) -> CommandStream:
        """Run a command and see its output as it is produced.

        ``async with await session.stream("make") as run: async for chunk in
        run: ...``, then ``run.result``. The command runs on the workspace's
        ``process`` module under the session's ``process`` policy (allowed
        commands, shell syntax, environment, timeout); leaving the block
        early kills it. See :class:`corral.CommandStream`.

        Args:
            command: The command line, as for ``workspace_run``.
            cwd: Working directory in the workspace (default: its root).
            env: Extra environment variables.
            timeout_s: Kill it after this many seconds (default and ceiling:
                the policy's).
            max_output_bytes: Bytes of each stream kept in ``run.result``.

        Raises:
            OperationError: ``unsupported`` when the session did not declare
                ``process`` (or its provider has no process module);
                ``invalid_argument`` for a timeout beyond the policy's.
        """
        policy = self.toolset.policies.get("process")
        if not isinstance(policy, ProcessPolicy):
            raise OperationError(
                "streaming output needs the 'process' capability: declare it in the "
                "capabilities (providers with a process module: local-bash, local-sandbox, "
                "docker)",
                code="unsupported",
            )
        request = stream_request(command, policy, cwd=cwd, env=env, timeout_s=timeout_s)
        workspace = await self.workspace()
        manager = workspace.module("process")
        if manager is None:
            raise OperationError("this workspace has no process module", code="unsupported")
        return CommandStream(
            cast(ProcessManager, manager), request, max_output_bytes=max_output_bytes
        )

    async def run_streaming(
        self,
        command: str,
        on_output: OutputCallback | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        max_output_bytes: int = 1_000_000,
    ) -> ExecResult:
        """Run a command to its end, calling ``on_output`` with each chunk as it arrives.

        The same as :meth:`stream` (same arguments, same errors), for callers
        that prefer a callback; returns the command's :class:`ExecResult`.
        """
        run = await self.stream(
            command, cwd=cwd, env=env, timeout_s=timeout_s, max_output_bytes=max_output_bytes
        )
        return await run_with_callback(run, on_output)

    async def stream_code(
        self,
        code: str,
        *,
        language: str = "python",
        timeout_s: float | None = None,
        max_output_bytes: int = 1_000_000,
    ) -> CommandStream:
        """Run a snippet in a fresh interpreter and see its output as it is produced.

        The streaming twin of ``workspace_run_code``: the snippet runs as a
        process (``python3 -u -c CODE``, see ``CODE_COMMANDS``) under the
        session's ``process`` policy, so its allowed commands must let the
        interpreter run. Use it as :meth:`stream`'s result is used.

        Raises:
            OperationError: ``unsupported`` for a language without a streamed
                runner, or as :meth:`stream`.
        """
        return await self.stream(
            code_command(language, code), timeout_s=timeout_s, max_output_bytes=max_output_bytes
        )

    def openai_tools(self, *, strict: bool = False) -> list[OpenAITool]:
        """OpenAI Chat Completions function specs of the tools.

        Args:
            strict: Strict-mode schemas with ``strict: true``; the bridges
                accept the arguments such a model sends.
        """
        return self.toolset.openai_tools(strict=strict)

    def openai_responses_tools(self, *, strict: bool = True) -> list[OpenAIResponsesTool]:
        """OpenAI Responses API function tools (strict-mode schemas by default)."""
        return self.toolset.openai_responses_tools(strict=strict)

    def anthropic_tools(self) -> list[AnthropicTool]:
        """Anthropic Messages API tool specs of the tools."""
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


def check_capabilities(
    provider: WorkspaceProvider, capabilities: object, plugins: PluginSet
) -> dict[str, Any]:
    """Validate a capability config against what the provider can populate.

    A capability the provider cannot populate is refused here, before any
    tool is listed or workspace opened: listing ``workspace_run`` for a
    provider without a shell would only fail at the model's first call.

    Returns:
        The config as a plain dict, each value merged over the provider's
        ``policy_defaults`` for that capability (the user's options win).

    Raises:
        ConfigError: Not a mapping of names, or a switched-on capability the
            provider cannot populate (the message names providers that can).
    """
    if not isinstance(capabilities, Mapping):
        raise ConfigError(
            "capabilities must be an object mapping names to true or options, e.g. "
            '{"fs": true, "shell": true}'
        )
    config: dict[str, Any] = {}
    for name, value in capabilities.items():
        if not isinstance(name, str) or not name.isprintable() or len(name) > 64:
            raise ConfigError("capabilities: every key must be a capability name")
        config[name] = value
    on = sorted(n for n, v in config.items() if v not in (False, None))
    for name in on:
        if name not in plugins.capabilities:
            known = ", ".join(sorted(plugins.capabilities)) or "none"
            raise ConfigError(f"unknown capability {name!r} (known: {known})")
    missing = [n for n in on if n not in provider.capabilities]
    kind = provider.provider_id
    if missing:
        supported = ", ".join(sorted(provider.capabilities)) or "none"
        able = sorted(
            k for k, spec in plugins.providers.items() if set(missing) <= spec.capabilities
        )
        advice = (
            f"; installed providers that can: {', '.join(able)}"
            if able
            else "; no installed provider can"
        )
        raise ConfigError(
            f"provider {kind} cannot populate capabilities: {', '.join(missing)} "
            f"(it supports: {supported}){advice}"
        )
    spec = plugins.providers.get(kind)
    defaults = spec.policy_defaults if spec is not None else {}
    for name in on:
        extra = defaults.get(name)
        if not extra:
            continue
        value = config[name]
        if value is True:
            config[name] = dict(extra)
        elif isinstance(value, Mapping):
            config[name] = {**extra, **value}
    return config


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
    open_strategy: Literal["lazy", "eager"] = "eager",
    raise_on_error: bool = False,
    close_on_exit: bool = True,
    plugins: PluginSet | None = None,
    regex_engine: RegexEngine | None = None,
    usage: UsageRecorder | None = None,
    trace_context: Mapping[str, str] | None = None,
    result_filter: ResultFilter | None = None,
    metrics: WorkspaceMetrics | None = None,
    observers: Iterable[EventSink] = (),
    transient_retry_attempts: int = 3,
    close_timeout_s: float = 30.0,
    reset_after_s: float | None = None,
    on_progress: ProgressCallback | None = None,
) -> AsyncIterator[WorkspaceSession]:
    """Open a session's workspace with its tools; close it on exit.

    The workspace is opened before the block runs, so a provider that cannot
    run here (bubblewrap missing, no Docker daemon) raises now, with the
    provider's advice, instead of at the model's first call. Hosts that want
    to defer the cost until a tool is used pass ``open_strategy="lazy"``.

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
        open_strategy: ``eager`` (default) opens (or resumes ``ref``) before
            yielding, so failures surface here; ``lazy`` opens at the first
            tool call, and a failure then reaches the model as an error result.
        raise_on_error: Default of ``WorkspaceSession.call(raise_on_error=)``.
        close_on_exit: Close the workspace on exit (False keeps it for a later resume).
        plugins: The plugin set (default: the installed plugins).
        usage: Receives ``workspace.<op>`` and the duration of each tool call
            (subscribed to the session's events as a ``UsageSink``).
        metrics: Counters and histograms (subscribed as a ``MetricsSink``).
        observers: Further event sinks, sync or async (see ``WorkspaceRegistry``).
        regex_engine, trace_context, result_filter: See WorkspaceToolset.
        transient_retry_attempts, close_timeout_s, reset_after_s: See WorkspaceRegistry.
        on_progress: Receives :class:`~corral.Progress` of long operations:
            an image pull while opening, snapshot, restore and branch during
            tool calls. Called from worker threads, throttled; a callback
            that raises is logged and dropped, never failing the operation.

    Raises:
        ConfigError: Unknown provider kind or capability, a capability the
            provider cannot populate, or a bad option.
        WorkspaceFailedError: The provider cannot open (or resume) the
            workspace; the message carries its advice (not with ``lazy``).
    """
    if open_strategy not in ("lazy", "eager"):
        raise ConfigError("open_strategy must be 'lazy' or 'eager'")
    plugins = plugins or default_plugins()
    instance = resolve_provider(provider, plugins, provider_options)
    if capabilities is None:
        capabilities = default_capabilities(instance, plugins)
    capabilities = check_capabilities(instance, capabilities, plugins)
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
        observers=[
            *([MetricsSink(metrics)] if metrics is not None else []),
            *([UsageSink(usage)] if usage is not None else []),
            *observers,
        ],
    )
    toolset = WorkspaceToolset(
        registry,
        plugins.capabilities,
        regex_engine=regex_engine,
        trace_context=trace_context,
        result_filter=result_filter,
        owns_registry=close_on_exit,
        on_progress=on_progress,
    )
    async with registry.delivering_events():
        try:
            if open_strategy == "eager":
                with reporting_progress(on_progress) if on_progress else contextlib.nullcontext():
                    opened = await registry.get()
                toolset.locate(workspace_path_of(opened.details()))
            else:
                toolset.locate(None)
            yield WorkspaceSession(registry, toolset, raise_on_error=raise_on_error)
        finally:
            await toolset.aclose()
