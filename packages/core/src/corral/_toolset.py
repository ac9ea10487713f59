"""The tool layer: capability tools bound to a registry, validated and observed.

Every call: arguments validated before any I/O -> handler -> one retry on
eviction -> errors turned into clean tool results -> result filter ->
usage, metrics and a log record carrying the trace context.
"""

from __future__ import annotations

import inspect
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final, Generic, TypeVar, cast

from attrs import AttrsInstance

from ._capabilities import AnyCapability, Capability, check_user_tool_name
from ._data import WorkspaceRef
from ._errors import (
    ConfigError,
    OperationError,
    WorkspaceEvictedError,
    WorkspaceFailedError,
)
from ._observe import UsageRecorder, guarded
from ._regex import RegexEngine, RegexModuleEngine
from ._registry import WorkspaceRegistry
from ._tool import PreparedCall, SessionControl, Tool, ToolEnv, ToolOutput, ToolResult, ToolSpec

__all__ = ["ResultFilter", "WorkspaceToolset"]

log = logging.getLogger("corral.tools")

PolicyT = TypeVar("PolicyT", bound=AttrsInstance)
ModuleT = TypeVar("ModuleT")

ResultFilter = Callable[[str, Mapping[str, object], ToolResult], ToolResult | Awaitable[ToolResult]]
"""Sees every result (and the validated arguments) before the model does; may scrub or
annotate it."""

_RESERVED_LOG_KEYS: Final = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
_HOOK_NAME: Final = re.compile(r"on_[a-z][a-z0-9_]{0,62}\Z")


class _SessionControl:
    """The registry seen through :class:`SessionControl`: adopt a ref, report events."""

    __slots__ = ("_registry",)

    def __init__(self, registry: WorkspaceRegistry) -> None:
        self._registry = registry

    async def adopt(self, ref: WorkspaceRef) -> str:
        await self._registry.swap_ref(ref)
        return (await self._registry.get()).id

    def emit(
        self, hook: str, *, status: str = "ok", detail: Mapping[str, str] | None = None
    ) -> None:
        # Hooks are looked up by attribute name: only on_* names may reach them.
        if not _HOOK_NAME.match(hook):
            raise ValueError("hook names are on_<lowercase identifier>")
        self._registry.emit(hook, status=status, detail=dict(detail or {}))


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
        self, hook: str, *, status: str = "ok", detail: Mapping[str, str] | None = None
    ) -> None:
        raise self._refuse()


class _Env(Generic[PolicyT, ModuleT]):
    """The :class:`ToolEnv` a capability's handlers get: policy, module, session control."""

    __slots__ = ("_module", "_registry", "policy", "regex_engine", "session")

    def __init__(
        self,
        registry: WorkspaceRegistry,
        policy: PolicyT,
        module: str,
        regex_engine: RegexEngine,
        session: SessionControl,
    ) -> None:
        self._registry = registry
        self._module = module
        self.policy = policy
        self.regex_engine = regex_engine
        self.session = session

    async def module(self) -> ModuleT:
        # The one trust point of the seam: the registry checked at open and
        # resolve that the provider populated this declared module, and the
        # capability's type parameter says which protocol it is.
        return cast(ModuleT, (await self._registry.get()).require(self._module))


class WorkspaceToolset:
    """The ``workspace_*`` tools of one session.

    Args:
        registry: The session's registry (its config says which capabilities
            are declared).
        capabilities: Capability plugins by name (``load_plugins().capabilities``).
        regex_engine: grep's engine (default: the ``regex`` module with a timeout).
        usage: Receives ``workspace.<op>`` and the duration of each call.
        trace_context: Opaque ids merged into every log record (trace_id, span_id).
        result_filter: Scrubs or annotates each result before the model sees it.
        owns_registry: ``aclose`` closes the registry. False for a sub-agent's
            tool set bound to its parent's registry (inherit_workspace).

    Raises:
        ConfigError: An unknown capability or a bad policy value.
    """

    def __init__(
        self,
        registry: WorkspaceRegistry,
        capabilities: Mapping[str, AnyCapability],
        *,
        regex_engine: RegexEngine | None = None,
        usage: UsageRecorder | None = None,
        trace_context: Mapping[str, str] | None = None,
        result_filter: ResultFilter | None = None,
        owns_registry: bool = True,
        logger: logging.Logger | None = None,
    ) -> None:
        self.registry = registry
        self.regex_engine = regex_engine or RegexModuleEngine()
        self._usage = usage
        self._trace = {
            (k if k not in _RESERVED_LOG_KEYS else f"trace_{k}"): v
            for k, v in (trace_context or {}).items()
        }
        self._filter = result_filter
        self.owns_registry = owns_registry
        self.log = logger or log
        self.policies: dict[str, object] = {}
        self._tools: dict[str, Tool] = {}
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
            _SessionControl(self.registry) if cap.controls_session else _NoSessionControl(name)
        )
        env: _Env[PolicyT, ModuleT] = _Env(
            self.registry, policy, cap.module, self.regex_engine, session
        )
        for spec in cap.tools(policy):
            if not spec.name.startswith("workspace_"):
                raise ConfigError(f"capability {name!r}: tool names must start with workspace_")
            if spec.name in self._tools:
                raise ConfigError(f"tool {spec.name!r} is contributed twice")
            self._tools[spec.name] = self._bind(spec, env, name)

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

    async def call(self, name: str, arguments: object) -> ToolResult:
        """Call a tool by name; an unknown name is an error result, not an exception."""
        tool = self._tools.get(name)
        if tool is None:
            shown = (
                name if isinstance(name, str) and len(name) <= 64 and name.isprintable() else "?"
            )
            return ToolResult(
                f"unknown tool {shown!r}; available: {', '.join(self._tools)}",
                is_error=True,
                error_code="invalid_argument",
            )
        return await tool(arguments)

    def check_user_tools(self, names: Iterable[str]) -> None:
        """Refuse user tools in the reserved ``workspace_``/``companion__`` namespaces.

        Raises:
            ConfigError: A name takes a reserved prefix.
        """
        for name in names:
            check_user_tool_name(name)

    def inherit(self) -> WorkspaceToolset:
        """A tool set for a sub-agent bound to this registry; closing it leaves it open."""
        child = object.__new__(WorkspaceToolset)
        child.__dict__.update(self.__dict__)
        child.owns_registry = False
        return child

    async def aclose(self) -> None:
        """Close the registry if this tool set owns it."""
        if self.owns_registry:
            await self.registry.close()

    # -- exporters --------------------------------------------------------------

    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools as OpenAI Chat Completions function specs."""
        return [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": dict(t.parameters),
                },
            }
            for t in self.tools
        ]

    def anthropic_tools(self) -> list[dict[str, Any]]:
        """The tools as Anthropic Messages API tool specs."""
        return [
            {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
            for t in self.tools
        ]

    # -- the call pipeline ---------------------------------------------------------

    def _bind(
        self, spec: ToolSpec[PolicyT, ModuleT], env: ToolEnv[PolicyT, ModuleT], capability: str
    ) -> Tool:
        async def invoke(arguments: object) -> ToolResult:
            return await self._invoke(spec, env, arguments)

        return Tool(spec.name, spec.description, spec.parameters, capability, invoke=invoke)

    async def _invoke(
        self, spec: ToolSpec[PolicyT, ModuleT], env: ToolEnv[PolicyT, ModuleT], arguments: object
    ) -> ToolResult:
        started = time.perf_counter()
        result: ToolResult | None = None
        call: PreparedCall[PolicyT, ModuleT] | None = None
        try:
            call = spec.prepare(arguments)
            output = await self._with_eviction_retry(call, env)
            result = ToolResult(output.text, data=output.data)
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
            self.log.exception("tool %s raised unexpectedly", spec.name, extra=self._trace)
            result = ToolResult(
                f"{spec.name} failed with an internal error; the operator has the details",
                is_error=True,
                error_code="internal",
            )
        finally:
            ms = (time.perf_counter() - started) * 1000
            status = "cancelled" if result is None else ("error" if result.is_error else "ok")
            self._record(spec.name, spec.op, ms, status, result)
        if self._filter is not None:
            args = call.as_mapping() if call is not None else {}
            result = await self._apply_filter(spec.name, args, result)
        return result

    async def _with_eviction_retry(
        self, call: PreparedCall[PolicyT, ModuleT], env: ToolEnv[PolicyT, ModuleT]
    ) -> ToolOutput:
        registry = self.registry
        try:
            return await call.run(env)
        except WorkspaceEvictedError:
            registry.mark_evicted()
        try:
            output = await call.run(env)
        except WorkspaceEvictedError:
            registry.mark_evicted()
            guarded(
                "inc_eviction_retry",
                registry.metrics.inc_eviction_retry,
                registry.provider.provider_id,
                "exhausted",
            )
            registry.emit("on_eviction_retry", status="exhausted")
            registry.log.error(  # noqa: TRY400 - the traceback adds nothing here
                "workspace tool: eviction retry exhausted", extra=self._trace
            )
            raise
        guarded(
            "inc_eviction_retry",
            registry.metrics.inc_eviction_retry,
            registry.provider.provider_id,
            "recovered",
        )
        registry.emit("on_eviction_retry", status="recovered")
        return output

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
                "result filter raised for %s; result withheld", name, extra=self._trace
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

    def _record(
        self, name: str, op: str, ms: float, status: str, result: ToolResult | None
    ) -> None:
        metrics = self.registry.metrics
        guarded("inc_tool_call", metrics.inc_tool_call, name, status)
        guarded("observe_tool_latency_ms", metrics.observe_tool_latency_ms, name, ms)
        if self._usage is not None:
            try:
                self._usage(f"workspace.{op}", ms, session_id=self.registry.session.session_id)
            except Exception:
                self.log.warning("usage recorder raised; ignored", exc_info=True)
        if self.log.isEnabledFor(logging.DEBUG) or status != "ok":
            self.log.log(
                logging.DEBUG if status == "ok" else logging.INFO,
                "workspace tool %s %s in %.2fms%s",
                name,
                status,
                ms,
                f" ({result.error_code})" if result is not None and result.error_code else "",
                extra={
                    **self._trace,
                    "corral_tool": name,
                    "corral_status": status,
                    "corral_duration_ms": ms,
                },
            )
