"""WorkspaceRegistry: one session's workspace, opened lazily, resolved, closed.

States: ``configured`` -> ``opening`` -> ``open`` -> ``closing`` -> ``closed``;
``failed`` after a permanent error (or exhausted transient retries);
``evicted`` when a module reported its backing resource gone (the next
``get`` re-resolves the persisted ref).

Decisions where the spec is loose:

* A persisted ref that no longer resolves leaves the entry ``failed`` with
  the provider's message; the registry never opens a fresh, empty workspace
  in its place. ``reset(discard_ref=True)`` is the operator's explicit way
  to start over.
* An evicted live workspace is dropped without ``close()``: closing would
  delete whatever the provider can still recover on resolve.
* ``swap_ref`` (restore/branch) keeps the previous live workspace until the
  registry closes, then closes it too: nothing the session made outlives it,
  and nothing is destroyed while the session may still need it.
"""

from __future__ import annotations

import inspect
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import Any, Final, Literal, Self, overload

import anyio
import attrs

from ._data import SessionRef, WorkspaceConfig, WorkspaceRef
from ._errors import OperationError, WorkspaceFailedError
from ._observe import (
    Event,
    EventSink,
    EventStream,
    LogSink,
    OpenRetrying,
    RegistryState,
    StateChanged,
    WorkspaceClosed,
    WorkspaceEvicted,
    WorkspaceOpened,
    WorkspaceOpenFailed,
)
from ._protocols import (
    CodeInterpreter,
    FileSystem,
    Shell,
    Snapshotter,
    Workspace,
    WorkspaceProvider,
)
from ._protocols import describe_workspace as _provider_details

__all__ = ["RegistrySnapshot", "RegistryState", "ScopedWorkspace", "WorkspaceRegistry"]

log = logging.getLogger("corral.registry")

PersistRef = Callable[[WorkspaceRef | None], Awaitable[None] | None]

MAX_TOTAL_BACKOFF_S: Final = 10.0


@attrs.frozen
class RegistrySnapshot:
    """A point-in-time view of a registry, cheap enough for a health endpoint."""

    state: RegistryState
    provider_id: str
    session_id: str
    workspace_id: str | None = None
    opened_at: float | None = None
    last_success_at: float | None = None
    last_attempt_at: float | None = None
    last_error: str | None = None
    declared: tuple[str, ...] = ()
    events_dropped: int = 0
    details: dict[str, Any] = attrs.field(factory=dict)


class ScopedWorkspace:
    """A workspace seen through the registry: only declared modules are reachable."""

    def __init__(self, inner: Workspace, modules: frozenset[str]) -> None:
        self._inner = inner
        self._modules = modules

    @property
    def inner(self) -> Workspace:
        """The provider's workspace this view scopes (identity: one per live workspace)."""
        return self._inner

    @property
    def id(self) -> str:
        """The workspace id."""
        return self._inner.id

    @property
    def fs(self) -> FileSystem | None:
        """The fs module, if declared."""
        return self._inner.fs if "fs" in self._modules else None

    @property
    def shell(self) -> Shell | None:
        """The shell module, if declared."""
        return self._inner.shell if "shell" in self._modules else None

    @property
    def code(self) -> CodeInterpreter | None:
        """The code module, if declared."""
        return self._inner.code if "code" in self._modules else None

    @property
    def script(self) -> CodeInterpreter | None:
        """The script module, if declared."""
        return self._inner.script if "script" in self._modules else None

    @property
    def snapshot(self) -> Snapshotter | None:
        """The snapshot module, if declared."""
        return self._inner.snapshot if "snapshot" in self._modules else None

    def module(self, name: str) -> object | None:
        """Any declared module by name."""
        return self._inner.module(name) if name in self._modules else None

    def details(self) -> Mapping[str, Any]:
        """The provider's facts about the workspace (``details()``), or nothing.

        The tool layer reads the commands' view of the root from them (see
        ``corral._mount``).
        """
        return _provider_details(self._inner)

    @overload
    def require(self, name: Literal["fs"]) -> FileSystem: ...
    @overload
    def require(self, name: Literal["shell"]) -> Shell: ...
    @overload
    def require(self, name: Literal["code", "script"]) -> CodeInterpreter: ...
    @overload
    def require(self, name: Literal["snapshot"]) -> Snapshotter: ...
    @overload
    def require(self, name: str) -> object: ...

    def require(self, name: str) -> object:
        """A declared module, or a clear error naming the capability to declare.

        Typed for core's modules by name; a plugin's module comes back as
        ``object`` here (its capability's tools get it typed through
        ``ToolEnv.module()``).

        Raises:
            WorkspaceFailedError: The module was not declared or not populated.
        """
        module = self.module(name)
        if module is None:
            raise WorkspaceFailedError(
                f"the workspace has no {name!r} module: declare capabilities.{name} "
                "in the workspace config (and use a provider that supports it)"
            )
        return module

    async def close(self) -> None:
        """Closing goes through the registry, never through a scoped view."""
        raise OperationError("close the workspace through its registry", code="unsupported")


class WorkspaceRegistry:
    """Owns one session's workspace.

    Args:
        config: Provider kind and declared capabilities.
        session: The owning session.
        provider: The provider instance (shared across sessions; stateless).
        ref: A persisted ref to resolve instead of opening (resume).
        persist_ref: Called with the new ref after open/swap, and None after close.
        modules: Module names reachable through :meth:`get` (least privilege);
            computed from the declared capabilities by the toolset.
        transient_retry_attempts: Retries of transient open/resolve failures.
        reset_after_s: A failed entry older than this reopens on ``get``.
        close_timeout_s: Bound on ``close``.
        open_limiter: Bounds concurrent opens, shareable across registries.
        observers: Event sinks (see ``corral._observe``): plain functions are
            called inline and guarded, coroutine functions are awaited through
            a bounded queue while the registry is entered. Wrap metrics and
            usage recorders in ``MetricsSink``/``UsageSink``.
        logger: Where lifecycle logs go (through a ``LogSink``, always subscribed).
    """

    def __init__(
        self,
        config: WorkspaceConfig,
        session: SessionRef,
        provider: WorkspaceProvider,
        *,
        ref: WorkspaceRef | None = None,
        persist_ref: PersistRef | None = None,
        modules: Iterable[str] | None = None,
        transient_retry_attempts: int = 3,
        reset_after_s: float | None = None,
        close_timeout_s: float = 30.0,
        open_limiter: anyio.CapacityLimiter | None = None,
        observers: Iterable[EventSink] = (),
        logger: logging.Logger | None = None,
    ) -> None:
        if provider.provider_id != config.provider.kind:
            raise WorkspaceFailedError(
                f"provider {provider.provider_id!r} cannot serve kind {config.provider.kind!r}",
                provider_id=provider.provider_id,
            )
        self.config = config
        self.session = session
        self.provider = provider
        self.declared = config.declared
        self.modules = frozenset(modules) if modules is not None else self.declared
        self._ref = ref
        self._persist = persist_ref
        self._attempts = max(0, transient_retry_attempts)
        self._reset_after = reset_after_s
        self._close_timeout = close_timeout_s
        self._limiter = open_limiter
        self.log = logger or log
        self._events = EventStream([LogSink(self.log), *observers])
        self._state: RegistryState = "configured"
        self._ws: Workspace | None = None
        self._scoped: ScopedWorkspace | None = None  # get()'s view of _ws, rebuilt when _ws changes
        self._retired: list[Workspace] = []
        self._lock = anyio.Lock()
        self._error: WorkspaceFailedError | None = None
        self._opened_at: float | None = None
        self._last_success: float | None = None
        self._last_attempt: float | None = None
        self._failed_at: float | None = None
        self._stack = AsyncExitStack()

    # -- context management -------------------------------------------------

    async def __aenter__(self) -> Self:
        self._stack = AsyncExitStack()
        await self._stack.__aenter__()
        await self._stack.enter_async_context(self.delivering_events())
        self._stack.push_async_callback(self.close)  # runs first: its event still reaches sinks
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.__aexit__(exc_type, exc, tb)

    @asynccontextmanager
    async def delivering_events(self) -> AsyncIterator[None]:
        """Deliver events to async observers for the duration of the block.

        Needed only when some observer is a coroutine function; their events
        emitted outside such a block are dropped and counted. ``async with
        registry`` and ``open_workspace`` enter it for you.
        """
        async with self._events.running():
            yield

    # -- events -------------------------------------------------------------

    @property
    def session_id(self) -> str:
        """The owning session's id (every event carries it)."""
        return self.session.session_id

    @property
    def provider_id(self) -> str:
        """The provider's id (every event carries it)."""
        return self.provider.provider_id

    def subscribe(self, sink: EventSink) -> None:
        """Add an observer after construction (it sees events from now on)."""
        self._events.subscribe(sink)

    def emit(self, event: Event) -> None:
        """Publish an event to every observer; never raises, never waits.

        The one path every observation takes: the registry's own lifecycle
        events and the tool layer's (tool calls, eviction retries, capability
        reports) alike.
        """
        self._events.emit(event)

    def observes_ok_tool_calls(self) -> bool:
        """Whether some observer would act on a successful tool call's event."""
        return self._events.observes_ok_tool_calls()

    def _set_state(self, state: RegistryState) -> None:
        previous = self._state
        self._state = state
        if previous != state:
            self.emit(
                StateChanged(
                    session_id=self.session.session_id,
                    provider_id=self.provider.provider_id,
                    previous=previous,
                    current=state,
                )
            )

    # -- state --------------------------------------------------------------

    @property
    def state(self) -> RegistryState:
        """The current lifecycle state."""
        return self._state

    @property
    def ref(self) -> WorkspaceRef | None:
        """The current ref (None before the first open)."""
        return self._ref

    def describe(self) -> RegistrySnapshot:
        """A frozen snapshot of the entry; never opens anything."""
        details: dict[str, Any] = {}
        if self._ws is not None:
            try:
                details = dict(_provider_details(self._ws))
            except Exception:
                self.log.warning("workspace details() raised; ignored", exc_info=True)
        return RegistrySnapshot(
            state=self._state,
            provider_id=self.provider.provider_id,
            session_id=self.session.session_id,
            workspace_id=self._ws.id if self._ws is not None else None,
            opened_at=self._opened_at,
            last_success_at=self._last_success,
            last_attempt_at=self._last_attempt,
            last_error=self._error.message if self._error else None,
            declared=tuple(sorted(self.declared)),
            events_dropped=self._events.dropped,
            details=details,
        )

    def reset(self, *, discard_ref: bool = False) -> None:
        """Operator recovery: move a failed (or evicted) entry back to configured.

        Not for the model: never expose it as a tool. With ``discard_ref`` the
        next ``get`` opens a brand-new workspace instead of resolving the old
        ref (for a workspace that is known to be lost).

        Raises:
            WorkspaceFailedError: The registry is closed.
        """
        if self._state in ("closing", "closed"):
            raise WorkspaceFailedError("the workspace registry is closed")
        if self._state in ("failed", "evicted", "configured"):
            self._set_state("configured")
            self._error = None
            if discard_ref:
                self._ref = None
            self.log.info("workspace registry: reset (discard_ref=%s)", discard_ref)

    def mark_evicted(self) -> None:
        """Record that the live workspace's backing resource is gone."""
        if self._state != "open":
            return
        workspace_id = self._ws.id if self._ws is not None else None
        self._ws = None
        self._set_state("evicted")
        self.emit(
            WorkspaceEvicted(
                session_id=self.session.session_id,
                provider_id=self.provider.provider_id,
                workspace_id=workspace_id,
            )
        )

    # -- get ------------------------------------------------------------------

    def live(self) -> ScopedWorkspace | None:
        """The live workspace if it is open now, else None; never opens.

        The tool layer's fast path: no coroutine per call when nothing needs opening.
        """
        ws = self._ws
        scoped = self._scoped
        if self._state == "open" and ws is not None and scoped is not None and scoped.inner is ws:
            return scoped
        return None

    async def get(self) -> ScopedWorkspace:
        """The live workspace, opening or resolving it first if needed.

        Raises:
            WorkspaceFailedError: It cannot be opened/resolved, or the registry
                is closed.
        """
        ws = self._ws
        if self._state == "open" and ws is not None:
            scoped = self._scoped
            if scoped is None or scoped.inner is not ws:
                scoped = self._scoped = ScopedWorkspace(ws, self.modules)
            return scoped
        async with self._lock:
            return ScopedWorkspace(await self._ensure_open(), self.modules)

    async def _ensure_open(self) -> Workspace:
        if self._state in ("closing", "closed"):
            raise WorkspaceFailedError(
                "the workspace registry is closed", provider_id=self.provider.provider_id
            )
        if self._state == "open" and self._ws is not None:
            return self._ws
        if self._state == "failed":
            assert self._error is not None
            cooled = (
                self._reset_after is not None
                and self._failed_at is not None
                and time.monotonic() - self._failed_at >= self._reset_after
            )
            if not cooled:
                raise self._error
            self.log.info("workspace registry: auto-reset after cooldown")
            self._set_state("configured")
        self._set_state("opening")
        try:
            ws = await self._open_with_retries()
        except WorkspaceFailedError as exc:
            self._error = exc
            self._failed_at = time.monotonic()
            self._set_state("failed")
            raise
        except BaseException:
            self._set_state("configured")  # cancelled: nothing was decided
            raise
        self._ws = ws
        self._error = None
        self._set_state("open")
        return ws

    async def _open_with_retries(self) -> Workspace:
        budget = MAX_TOTAL_BACKOFF_S
        attempt = 0
        while True:
            try:
                return await self._open_once()
            except WorkspaceFailedError as exc:
                if not exc.transient or attempt >= self._attempts or budget <= 0:
                    raise
                delay = min(budget, 0.2 * 2**attempt) * random.uniform(0.5, 1.0)  # noqa: S311
                budget -= delay
                attempt += 1
                self.emit(
                    OpenRetrying(
                        session_id=self.session.session_id,
                        provider_id=self.provider.provider_id,
                        attempt=attempt,
                        max_attempts=self._attempts,
                        delay_s=delay,
                    )
                )
                await anyio.sleep(delay)

    async def _open_once(self) -> Workspace:
        provider_id = self.provider.provider_id
        self._last_attempt = time.time()
        started = time.perf_counter()
        resolving = self._ref is not None
        try:
            if self._limiter is not None:
                async with self._limiter:
                    ws, ref = await self._call_provider()
            else:
                ws, ref = await self._call_provider()
            self._check_contract(ws, ref)
        except WorkspaceFailedError as exc:
            self.emit(
                WorkspaceOpenFailed(
                    session_id=self.session.session_id,
                    provider_id=provider_id,
                    resolved=resolving,
                    error=exc.message,
                    transient=exc.transient,
                    duration_ms=(time.perf_counter() - started) * 1000,
                )
            )
            raise
        if not resolving:
            self._ref = ref
            await self._persist_ref(ref)
        now = time.time()
        self._opened_at = self._opened_at or now
        self._last_success = now
        self.emit(
            WorkspaceOpened(
                session_id=self.session.session_id,
                provider_id=provider_id,
                workspace_id=ws.id,
                resolved=resolving,
                duration_ms=(time.perf_counter() - started) * 1000,
            )
        )
        return ws

    async def _call_provider(self) -> tuple[Workspace, WorkspaceRef]:
        provider_id = self.provider.provider_id
        ref = self._ref
        try:
            if ref is not None:
                ws = await self.provider.resolve(ref)
            else:
                opened = await self.provider.open(self.config.provider, self.session, self.declared)
                ws, ref = opened.workspace, opened.ref
        except WorkspaceFailedError:
            raise
        except Exception as exc:
            raise WorkspaceFailedError(
                f"provider {provider_id} failed: {type(exc).__name__}: {str(exc)[:200]}",
                provider_id=provider_id,
                cause=exc,
            ) from exc
        return ws, ref

    def _check_contract(self, ws: Workspace, ref: WorkspaceRef) -> None:
        """Declared ⊆ ref capabilities, and every declared module present."""
        provider_id = self.provider.provider_id
        missing = sorted(self.declared - ref.capabilities)
        if missing:
            raise WorkspaceFailedError(
                f"provider {provider_id} does not advertise declared capabilities: "
                f"{', '.join(missing)}",
                provider_id=provider_id,
            )
        absent = sorted(m for m in self.modules if ws.module(m) is None)
        if absent:
            raise WorkspaceFailedError(
                f"provider {provider_id} returned a workspace without declared modules: "
                f"{', '.join(absent)}",
                provider_id=provider_id,
            )

    # -- swap / close ---------------------------------------------------------

    async def swap_ref(self, ref: WorkspaceRef) -> None:
        """Adopt a new ref (after restore or branch) and persist it.

        Raises:
            WorkspaceFailedError: The ref is foreign, or does not resolve.
        """
        if ref.provider_id != self.provider.provider_id:
            raise WorkspaceFailedError(
                "cannot swap to a ref of another provider", provider_id=self.provider.provider_id
            )
        async with self._lock:
            if self._state in ("closing", "closed"):
                raise WorkspaceFailedError("the workspace registry is closed")
            if ref == self._ref and self._ws is not None:
                await self._persist_ref(ref)
                return
            previous_ref, previous_ws = self._ref, self._ws
            self._ref = ref
            try:
                ws = await self._open_once()
            except BaseException:
                self._ref = previous_ref
                raise
            if previous_ws is not None and previous_ws is not ws:
                self._retired.append(previous_ws)
            self._ws = ws
            self._set_state("open")
            await self._persist_ref(ref)

    async def close(self) -> None:
        """Close the workspace (and any it replaced), bounded by ``close_timeout_s``.

        Idempotent. A close that times out or fails is logged and counted; the
        registry ends ``closed`` either way.
        """
        async with self._lock:
            if self._state in ("closing", "closed"):
                return
            started = time.perf_counter()
            workspace_id = self._ws.id if self._ws is not None else None
            self._set_state("closing")
            workspaces = [w for w in (*self._retired, self._ws) if w is not None]
            self._ws = None
            self._retired.clear()
            status: Literal["ok", "timeout", "error"] = "ok"
            with anyio.move_on_after(self._close_timeout, shield=True) as scope:
                for ws in workspaces:
                    try:
                        await ws.close()
                    except Exception:
                        status = "error"
                        self.log.exception("workspace close failed")
            if scope.cancelled_caught:
                status = "timeout"
            self._set_state("closed")
            had_workspace = bool(workspaces) or self._ref is not None
            if self._ref is not None:
                self._ref = None
                await self._persist_ref(None)
            if had_workspace:
                self.emit(
                    WorkspaceClosed(
                        session_id=self.session.session_id,
                        provider_id=self.provider.provider_id,
                        workspace_id=workspace_id,
                        status=status,
                        duration_ms=(time.perf_counter() - started) * 1000,
                    )
                )

    # -- helpers --------------------------------------------------------------

    async def _persist_ref(self, ref: WorkspaceRef | None) -> None:
        if self._persist is None:
            return
        result = self._persist(ref)
        if inspect.isawaitable(result):
            await result
