"""The tool layer: capability tools bound to a registry, validated and observed.

Every call: arguments validated before any I/O -> handler -> one retry on
eviction -> errors turned into clean tool results -> one
:class:`~corral._observe.ToolCallFinished` event (usage, metrics and the log
record are sinks of it) -> result filter.

The toolset needs five things of the session's registry and sees only those,
through :class:`ToolHost`: the config, the reachable modules, the live
workspace, a way to adopt a ref or report an eviction, and ``emit``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Final, Generic, Literal, NamedTuple, Protocol, TypeVar, cast

import attrs
from attrs import AttrsInstance

from ._bridges import (
    AnthropicTool,
    OpenAIResponsesTool,
    OpenAITool,
    anthropic_tool,
    openai_responses_tool,
    openai_tool,
)
from ._capabilities import AnyCapability, Capability, check_user_tool_name
from ._data import WorkspaceConfig, WorkspaceRef
from ._echo import echo_if_short
from ._errors import (
    ConfigError,
    OperationError,
    WorkspaceEvictedError,
    WorkspaceFailedError,
)
from ._mount import PathView, path_fields, paths_note, workspace_path_of
from ._observe import (
    CapabilityEvent,
    Event,
    EvictionRetried,
    ToolCallFinished,
    ToolStatus,
    log_extra,
)
from ._progress import ProgressCallback, reporting_progress
from ._regex import RegexEngine, RegexModuleEngine
from ._registry import ScopedWorkspace
from ._tool import PreparedCall, SessionControl, Tool, ToolEnv, ToolResult, ToolSpec

__all__ = ["ResultFilter", "ToolHost", "WorkspaceToolset"]

log = logging.getLogger("corral.tools")

PolicyT = TypeVar("PolicyT", bound=AttrsInstance)
ModuleT = TypeVar("ModuleT")

ResultFilter = Callable[[str, Mapping[str, object], ToolResult], ToolResult | Awaitable[ToolResult]]
"""Sees every result (and the validated arguments) before the model does; may scrub or
annotate it."""

_EVENT_NAME: Final = re.compile(r"[a-z][a-z0-9_]{0,62}\Z")
_NOTED_TOOLS: Final = frozenset({"workspace_read_file", "workspace_write_file", "workspace_run"})
"""Where the model reads where the workspace is: the first file tools and the shell."""


class ToolHost(Protocol):
    """What the tool layer needs of a session's registry, and nothing more.

    ``WorkspaceRegistry`` is one; a test or an embedding may supply another.
    Deliberately absent: reset, describe and the registry's internals.
    """

    @property
    def config(self) -> WorkspaceConfig:
        """Provider kind and declared capabilities."""
        ...

    @property
    def modules(self) -> frozenset[str]:
        """The module names tools may reach."""
        ...

    @property
    def session_id(self) -> str:
        """The session every event is stamped with."""
        ...

    @property
    def provider_id(self) -> str:
        """The provider every event is stamped with."""
        ...

    async def get(self) -> ScopedWorkspace:
        """The live workspace, opened or resolved on first use."""
        ...

    def live(self) -> ScopedWorkspace | None:
        """The live workspace if it is open now, else None; never opens (no await)."""
        ...

    async def swap_ref(self, ref: WorkspaceRef) -> None:
        """Adopt another workspace of the same provider (restore, branch)."""
        ...

    def mark_evicted(self) -> None:
        """Record that the live workspace's backing resource is gone."""
        ...

    def emit(self, event: Event) -> None:
        """Publish an observation; never raises."""
        ...

    def observes_ok_tool_calls(self) -> bool:
        """Whether some observer would act on a successful call's event.

        False lets the tool layer skip building an event per call that
        nobody reads (the default log sink records ok calls at DEBUG only).
        """
        ...

    async def close(self) -> None:
        """Close the session's workspace."""
        ...


class _SessionControl:
    """The host seen through :class:`SessionControl`: adopt a ref, report events."""

    __slots__ = ("_capability", "_host")

    def __init__(self, host: ToolHost, capability: str) -> None:
        self._host = host
        self._capability = capability

    async def adopt(self, ref: WorkspaceRef) -> str:
        await self._host.swap_ref(ref)
        return (await self._host.get()).id

    def emit(
        self, name: str, *, status: str = "ok", detail: Mapping[str, str] | None = None
    ) -> None:
        # Names end up as metric labels and log fields: keep them identifiers.
        if not _EVENT_NAME.match(name):
            raise ValueError("event names are lowercase identifiers")
        self._host.emit(
            CapabilityEvent(
                session_id=self._host.session_id,
                provider_id=self._host.provider_id,
                capability=self._capability,
                name=name,
                status=status,
                detail=dict(detail or {}),
            )
        )


class _NoSessionControl:
    """What ``env.session`` is for capabilities that did not ask to control the session."""

    __slots__ = ("_capability",)

    def __init__(self, capability: str) -> None:
        self._capability = capability

    def _refuse(self) -> RuntimeError:
        return RuntimeError(
            f"capability {self._capability!r} uses env.session without registering "
            "with Capability(..., controls_session=True)"
        )

    async def adopt(self, ref: WorkspaceRef) -> str:
        raise self._refuse()

    def emit(
        self, name: str, *, status: str = "ok", detail: Mapping[str, str] | None = None
    ) -> None:
        raise self._refuse()


_NO_PROGRESS_SCOPE: Final = contextlib.nullcontext()
"""Reusable (nullcontext keeps no state): one less object per call."""


class _ViewCache:
    """The path view of the workspace a tool set last saw.

    A workspace's mount path is fixed for its life, and building
    ``details()`` on every call cost more than the rest of the path handling;
    one slot (checked by identity) is all a session needs: its workspace
    changes only at restore, branch or a re-resolve.
    """

    __slots__ = ("_view", "_ws")

    def __init__(self) -> None:
        self._ws: object = None
        self._view = PathView()

    def get(self, ws: ScopedWorkspace) -> PathView:
        """The view of ``ws``; a provider whose ``details()`` fails keeps the plain view."""
        inner = ws.inner
        if inner is self._ws:
            return self._view
        try:
            view = PathView(workspace_path_of(ws.details()))
        except Exception:
            log.warning("workspace details() raised; paths shown workspace-relative", exc_info=True)
            view = PathView()
        self._ws, self._view = inner, view
        return view


def _located(
    view: PathView, fields: tuple[str, ...], arguments: object
) -> dict[str, object] | None:
    """The arguments with absolute paths under the mount path made workspace-relative.

    None when nothing changes (always for a workspace seen at ``/``). Runs
    after validation: the caller validates what this returns again.
    """
    if view.root == "/" or (type(arguments) is not dict and not isinstance(arguments, Mapping)):
        return None
    changed: dict[str, object] = {}
    for name in fields:
        value = arguments.get(name)
        if isinstance(value, str) and value.startswith("/"):
            inner = view.accept(value)
            if inner is not None:
                changed[name] = inner
    return {**arguments, **changed} if changed else None


class _Env(Generic[PolicyT, ModuleT]):
    """The :class:`ToolEnv` a capability's handlers get: policy, module, session control."""

    __slots__ = ("_host", "_module", "_views", "policy", "regex_engine", "session")

    def __init__(
        self,
        host: ToolHost,
        policy: PolicyT,
        module: str,
        regex_engine: RegexEngine,
        session: SessionControl,
        *,
        views: _ViewCache,
    ) -> None:
        self._host = host
        self._module = module
        self._views = views
        self.policy = policy
        self.regex_engine = regex_engine
        self.session = session

    async def module(self) -> ModuleT:
        # The one trust point of the seam: the registry checked at open and
        # resolve that the provider populated this declared module, and the
        # capability's type parameter says which protocol it is.
        host = self._host
        ws = host.live() or await host.get()
        return cast(ModuleT, ws.require(self._module))

    async def paths(self) -> PathView:
        host = self._host
        return self._views.get(host.live() or await host.get())


def _tool(
    spec: ToolSpec[PolicyT, ModuleT],
    capability: str,
    invoke: Callable[[object, bool], Awaitable[ToolResult]],
) -> Tool:
    """The public :class:`Tool` of a spec, calling ``invoke`` (the toolset's pipeline)."""
    return Tool(
        spec.name,
        spec.description,
        spec.parameters,
        capability,
        invoke=invoke,
        strict_parameters=spec.strict_parameters,
        hints=spec.hints,
        output_schema=spec.output_schema,
    )


class _Binding(NamedTuple, Generic[PolicyT, ModuleT]):
    """A tool spec bound to its capability's environment (built once per tool)."""

    spec: ToolSpec[PolicyT, ModuleT]
    env: ToolEnv[PolicyT, ModuleT]
    capability: str
    paths: tuple[str, ...]
    """Argument names declared as workspace paths (see ``_locate_paths``)."""


class WorkspaceToolset:
    """The ``workspace_*`` tools of one session.

    Every call ends in one :class:`~corral._observe.ToolCallFinished` event
    published through the registry: usage, metrics and logs are observers of
    the registry (``observers=`` there, or ``usage=``/``metrics=`` of
    ``open_workspace``), not of the tool set.

    Args:
        registry: The session's registry, seen through :class:`ToolHost` (its
            config says which capabilities are declared).
        capabilities: Capability plugins by name (``load_plugins().capabilities``).
        regex_engine: grep's engine (default: the ``regex`` module with a timeout).
        trace_context: Opaque ids carried by every event this tool set emits
            and merged into its log records (trace_id, span_id).
        result_filter: Scrubs or annotates each result before the model sees it.
        owns_registry: ``aclose`` closes the registry. False for a sub-agent's
            tool set bound to its parent's registry (see :meth:`inherit`).
        logger: Where unexpected handler and filter failures are logged.
        on_progress: Receives progress of the long operations a call runs
            (snapshot, restore, branch, an image pull at a lazy open); set
            around each call (see :mod:`corral._progress` for why a context
            variable). None leaves a caller's :func:`~corral.reporting_progress`
            in force.

    Raises:
        ConfigError: An unknown capability or a bad policy value.
    """

    def __init__(
        self,
        registry: ToolHost,
        capabilities: Mapping[str, AnyCapability],
        *,
        regex_engine: RegexEngine | None = None,
        trace_context: Mapping[str, str] | None = None,
        result_filter: ResultFilter | None = None,
        owns_registry: bool = True,
        logger: logging.Logger | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self.registry = registry
        self.on_progress = on_progress
        self._capabilities = capabilities
        self.regex_engine = regex_engine or RegexModuleEngine()
        self._trace: Mapping[str, str] = dict(trace_context or {})
        self._log_extra = log_extra(self._trace)
        self._filter = result_filter
        self.owns_registry = owns_registry
        self.log = logger or log
        self.policies: dict[str, object] = {}
        self._tools: dict[str, Tool] = {}
        self._invokers: dict[str, Callable[[object, bool], Awaitable[ToolResult]]] = {}
        self._descriptions: dict[str, str] = {}
        self._location: tuple[str | None] | None = None
        self._views = _ViewCache()
        for name, value in sorted(registry.config.capabilities.items()):
            if value in (False, None):
                continue
            if name not in capabilities:
                known = ", ".join(sorted(capabilities)) or "none"
                raise ConfigError(f"unknown capability {name!r} (known: {known})")
            self._add_capability(capabilities[name], value)

    def _add_capability(self, cap: Capability[PolicyT, ModuleT], value: object) -> None:
        name = cap.name
        policy = cap.parse_policy(value)
        self.policies[name] = policy
        if cap.module not in self.registry.modules:
            raise ConfigError(
                f"capability {name!r} needs module {cap.module!r}, which the registry hides"
            )
        session: SessionControl = (
            _SessionControl(self.registry, name)
            if cap.controls_session
            else _NoSessionControl(name)
        )
        env: _Env[PolicyT, ModuleT] = _Env(
            self.registry, policy, cap.module, self.regex_engine, session, views=self._views
        )
        for spec in cap.tools(policy):
            if not spec.name.startswith("workspace_"):
                raise ConfigError(f"capability {name!r}: tool names must start with workspace_")
            if spec.name in self._tools:
                raise ConfigError(f"tool {spec.name!r} is contributed twice")
            # A partial, not a closure around _invoke: one coroutine less per call.
            invoke = functools.partial(
                self._invoke, _Binding(spec, env, name, path_fields(spec.args_type))
            )
            self._invokers[spec.name] = invoke
            self._tools[spec.name] = _tool(spec, name, invoke)

    @property
    def tools(self) -> tuple[Tool, ...]:
        """Every tool, in a stable order."""
        return tuple(self._tools.values())

    def tool(self, name: str) -> Tool:
        """A tool by name.

        Raises:
            KeyError: No such tool in this session.
        """
        return self._tools[name]

    async def call(self, name: str, arguments: object, *, strict: bool = False) -> ToolResult:
        """Call a tool by name; an unknown name is an error result, not an exception.

        ``strict`` also accepts the strict-mode form of the arguments
        (:attr:`Tool.strict_parameters`).
        """
        invoke = self._invokers.get(name)
        if invoke is None:
            return ToolResult(
                f"unknown tool {echo_if_short(name)!r}; available: {', '.join(self._tools)}",
                is_error=True,
                error_code="invalid_argument",
            )
        # What Tool.__call__ would await, without its coroutine in between.
        return await invoke(arguments, strict)

    def check_user_tools(self, names: Iterable[str]) -> None:
        """Refuse user tools in the reserved ``workspace_``/``companion__`` namespaces.

        Raises:
            ConfigError: A name takes a reserved prefix.
        """
        for name in names:
            check_user_tool_name(name)

    def inherit(
        self,
        *,
        trace_context: Mapping[str, str] | None = None,
        result_filter: ResultFilter | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> WorkspaceToolset:
        """A tool set for a sub-agent, bound to this session's workspace.

        The child is built like any tool set (same capabilities, policies and
        regex engine) and its tools run through its *own* pipeline, so its
        trace context and result filter apply to its calls only. Closing it
        leaves the workspace open.

        Args:
            trace_context: The sub-agent's ids (default: this tool set's).
            result_filter: The sub-agent's filter (default: this tool set's).
            on_progress: The sub-agent's progress callback (default: this tool set's).
        """
        child = WorkspaceToolset(
            self.registry,
            self._capabilities,
            regex_engine=self.regex_engine,
            trace_context=self._trace if trace_context is None else trace_context,
            result_filter=self._filter if result_filter is None else result_filter,
            owns_registry=False,
            logger=self.log,
            on_progress=self.on_progress if on_progress is None else on_progress,
        )
        if self._location is not None:
            child.locate(self._location[0])
        return child

    async def aclose(self) -> None:
        """Close the registry if this tool set owns it."""
        if self.owns_registry:
            await self.registry.close()

    # -- exporters --------------------------------------------------------------

    def openai_tools(self, *, strict: bool = False) -> list[OpenAITool]:
        """The tools as OpenAI Chat Completions function specs (see :func:`corral.openai_tool`)."""
        return [openai_tool(t, strict=strict) for t in self.tools]

    def openai_responses_tools(self, *, strict: bool = True) -> list[OpenAIResponsesTool]:
        """The tools as OpenAI Responses API function tools (strict by default, as the API)."""
        return [openai_responses_tool(t, strict=strict) for t in self.tools]

    def anthropic_tools(self) -> list[AnthropicTool]:
        """The tools as Anthropic Messages API tool specs."""
        return [anthropic_tool(t) for t in self.tools]

    # -- the call pipeline ---------------------------------------------------------

    async def _invoke(
        self, binding: _Binding[PolicyT, ModuleT], arguments: object, strict: bool
    ) -> ToolResult:
        spec, env, capability, paths = binding
        started = time.perf_counter()
        result: ToolResult | None = None
        call: PreparedCall[PolicyT, ModuleT] | None = None
        try:
            call = spec.prepare(arguments, strict=strict)
            live = self.registry.live() if paths else None
            if self.on_progress is None and (live is not None or not paths):
                # The common case, without an await before the handler's: the
                # workspace is live (its path view cached) or no path needs it.
                if live is not None:
                    view = self._views.get(live)
                    located = None if view.root == "/" else _located(view, paths, arguments)
                    if located is not None:
                        call = spec.prepare(located, strict=strict)
                try:
                    result = await call.run(env)
                except WorkspaceEvictedError:
                    result = await self._retry_after_eviction(spec.name, call, env)
            else:
                # Locating may open the workspace (a lazy open can pull an image).
                with self._progress_scope():
                    located = await self._locate_paths(paths, arguments) if paths else None
                    if located is not None:
                        call = spec.prepare(located, strict=strict)
                    result = await self._run_retrying(spec.name, call, env)
        except OperationError as exc:
            result = ToolResult(exc.message, is_error=True, error_code=exc.code)
        except WorkspaceFailedError as exc:
            result = ToolResult(
                f"workspace unavailable: {exc.message}",
                is_error=True,
                error_code="workspace_failed",
            )
        except WorkspaceEvictedError as exc:
            result = ToolResult(
                f"workspace evicted: {exc.message}", is_error=True, error_code="workspace_evicted"
            )
        except ConfigError as exc:
            result = ToolResult(str(exc), is_error=True, error_code="invalid_argument")
        except Exception:
            self.log.exception("tool %s raised unexpectedly", spec.name, extra=self._log_extra)
            result = ToolResult(
                f"{spec.name} failed with an internal error; the operator has the details",
                is_error=True,
                error_code="internal",
            )
        finally:
            status: ToolStatus = (
                "cancelled" if result is None else ("error" if result.is_error else "ok")
            )
            # Most calls are ok ones nobody but a DEBUG log would see: no event then.
            if status != "ok" or self.registry.observes_ok_tool_calls():
                self._finished(spec, capability, status, started, result)
        if self._filter is not None:
            args = call.as_mapping() if call is not None else {}
            result = await self._apply_filter(spec.name, args, result)
        return result

    async def _run_retrying(
        self, tool: str, call: PreparedCall[PolicyT, ModuleT], env: ToolEnv[PolicyT, ModuleT]
    ) -> ToolResult:
        """Run the call, and once more if the workspace was evicted (the general path)."""
        try:
            return await call.run(env)
        except WorkspaceEvictedError:
            return await self._retry_after_eviction(tool, call, env)

    def _finished(
        self,
        spec: ToolSpec[PolicyT, ModuleT],
        capability: str,
        status: ToolStatus,
        started: float,
        result: ToolResult | None,
    ) -> None:
        host = self.registry
        host.emit(
            ToolCallFinished(
                session_id=host.session_id,
                provider_id=host.provider_id,
                tool=spec.name,
                op=spec.op,
                capability=capability,
                status=status,
                duration_ms=(time.perf_counter() - started) * 1000,
                error_code=None if result is None else result.error_code,
                trace=self._trace,
            )
        )

    def _progress_scope(self) -> contextlib.AbstractContextManager[None]:
        if self.on_progress is None:
            return _NO_PROGRESS_SCOPE
        return reporting_progress(self.on_progress)

    async def _locate_paths(
        self, fields: tuple[str, ...], arguments: object
    ) -> dict[str, object] | None:
        """:func:`_located` on the general path, where the workspace may not be open yet.

        Asks for the workspace (opening it) only when some path argument is
        absolute: a relative one never depends on the mount path.
        """
        if not isinstance(arguments, Mapping):
            return None
        if not any(isinstance(v := arguments.get(f), str) and v.startswith("/") for f in fields):
            return None
        host = self.registry
        return _located(self._views.get(host.live() or await host.get()), fields, arguments)

    def locate(self, workspace_path: str | None) -> None:
        """Tell the model where the workspace is, in the descriptions of the tools that use paths.

        ``open_workspace`` calls it once the workspace is open (with its mount
        path) and, for a lazy open, with None (a note that needs no path).
        Descriptions are rebuilt from the capability's own each time.
        """
        self._location = (workspace_path,)
        note = paths_note(workspace_path)
        for name, tool in self._tools.items():
            base = self._descriptions.setdefault(name, tool.description)
            if name in _NOTED_TOOLS:
                self._tools[name] = attrs.evolve(tool, description=base + note)

    async def _retry_after_eviction(
        self, tool: str, call: PreparedCall[PolicyT, ModuleT], env: ToolEnv[PolicyT, ModuleT]
    ) -> ToolResult:
        """Run the call once more after the first run found the workspace evicted."""
        host = self.registry
        host.mark_evicted()
        try:
            result = await call.run(env)
        except WorkspaceEvictedError:
            host.mark_evicted()
            self._retried(tool, "exhausted")
            raise
        self._retried(tool, "recovered")
        return result

    def _retried(self, tool: str, outcome: Literal["recovered", "exhausted"]) -> None:
        host = self.registry
        host.emit(
            EvictionRetried(
                session_id=host.session_id,
                provider_id=host.provider_id,
                tool=tool,
                outcome=outcome,
                trace=self._trace,
            )
        )

    async def _apply_filter(
        self, name: str, args: Mapping[str, object], result: ToolResult
    ) -> ToolResult:
        assert self._filter is not None
        try:
            filtered: object = self._filter(name, args, result)
            if inspect.isawaitable(filtered):
                filtered = await filtered
        except Exception:
            # Fail closed: an unfiltered result may be exactly what the filter exists to stop.
            self.log.exception(
                "result filter raised for %s; result withheld", name, extra=self._log_extra
            )
            return ToolResult(
                "the result was withheld because the result filter failed",
                is_error=True,
                error_code="internal",
            )
        if not isinstance(filtered, ToolResult):
            self.log.error(
                "result filter returned %s, not a ToolResult; result withheld",
                type(filtered).__name__,
            )
            return ToolResult(
                "the result was withheld by the result filter", is_error=True, error_code="internal"
            )
        return filtered
