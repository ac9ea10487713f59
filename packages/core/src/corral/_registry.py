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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import Any, Final, Literal, Self, overload

import anyio
import attrs

from ._data import SessionRef, WorkspaceConfig, WorkspaceRef
from ._errors import OperationError, WorkspaceFailedError
from ._observe import HookDispatcher, NoopMetrics, WorkspaceEvent, WorkspaceMetrics, guarded
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

RegistryState = Literal["configured", "opening", "open", "closing", "closed", "failed", "evicted"]
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
    hooks_dropped: int = 0
    details: dict[str, Any] = attrs.field(factory=dict)


class ScopedWorkspace:
    """A workspace seen through the registry: only declared modules are reachable."""

    def __init__(self, inner: Workspace, modules: frozenset[str]) -> None:
        self._inner = inner
        self._modules = modules

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
        metrics: Metrics sink.
        hooks: Objects with ``on_open``/``on_close``/... methods.
        logger: Where lifecycle logs go.
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
        metrics: WorkspaceMetrics | None = None,
        hooks: Iterable[object] = (),
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
        self.metrics: WorkspaceMetrics = metrics or NoopMetrics()
        self.log = logger or log
        self.hooks = HookDispatcher(list(hooks), self.metrics)
        self._state: RegistryState = "configured"
        self._ws: Workspace | None = None
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
        await self._stack.enter_async_context(self.hooks_running())
        self._stack.push_async_callback(self.close)  # runs first: on_close still reaches hooks
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.__aexit__(exc_type, exc, tb)

    @asynccontextmanager
    async def hooks_running(self) -> AsyncIterator[None]:
        """Run the async-hook dispatcher for the duration of the block.

        Needed only when some hook is a coroutine function; events emitted
        while no dispatcher runs are dropped and counted.
        """
        if not self.hooks.has_async:
            yield
            return
        async with anyio.create_task_group() as tg:
            await tg.start(self.hooks.run)
            try:
                yield
            finally:
                await self.hooks.drain(tg.cancel_scope)

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
            hooks_dropped=self.hooks.dropped,
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
            self._state = "configured"
            self._error = None
            if discard_ref:
                self._ref = None
            self.log.info("workspace registry: reset (discard_ref=%s)", discard_ref)

    def mark_evicted(self) -> None:
        """Record that the live workspace's backing resource is gone."""
        if self._state != "open":
            return
        self._state = "evicted"
        self._ws = None
        guarded("inc_eviction", self.metrics.inc_eviction, self.provider.provider_id)
        self._emit("on_evicted")

    # -- get ------------------------------------------------------------------

    async def get(self) -> ScopedWorkspace:
        """The live workspace, opening or resolving it first if needed.

        Raises:
            WorkspaceFailedError: It cannot be opened/resolved, or the registry
                is closed.
        """
        ws = self._ws
        if self._state == "open" and ws is not None:
            return ScopedWorkspace(ws, self.modules)
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
            self._state = "configured"
        self._state = "opening"
        try:
            ws = await self._open_with_retries()
        except WorkspaceFailedError as exc:
            self._state = "failed"
            self._error = exc
            self._failed_at = time.monotonic()
            raise
        except BaseException:
            self._state = "configured"  # cancelled: nothing was decided
            raise
        self._ws = ws
        self._state = "open"
        self._error = None
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
                self.log.warning(
                    "workspace registry: transient failure, retry %d/%d in %.2fs",
                    attempt,
                    self._attempts,
                    delay,
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
            guarded("inc_open", self.metrics.inc_open, provider_id, "failed")
            self.log.warning(
                "workspace %s failed: %s", "resolve" if resolving else "open", exc.message
            )
            raise
        if not resolving:
            self._ref = ref
            await self._persist_ref(ref)
        now = time.time()
        self._opened_at = self._opened_at or now
        self._last_success = now
        ms = (time.perf_counter() - started) * 1000
        guarded("inc_open", self.metrics.inc_open, provider_id, "ok")
        guarded("observe_open_latency_ms", self.metrics.observe_open_latency_ms, provider_id, ms)
        self._emit("on_open", workspace_id=ws.id, detail={"resolved": resolving, "ms": ms})
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
            self._state = "open"
            await self._persist_ref(ref)

    async def close(self) -> None:
        """Close the workspace (and any it replaced), bounded by ``close_timeout_s``.

        Idempotent. A close that times out or fails is logged and counted; the
        registry ends ``closed`` either way.
        """
        async with self._lock:
            if self._state in ("closing", "closed"):
                return
            self._state = "closing"
            workspaces = [w for w in (*self._retired, self._ws) if w is not None]
            self._ws = None
            self._retired.clear()
            status = "ok"
            with anyio.move_on_after(self._close_timeout, shield=True) as scope:
                for ws in workspaces:
                    try:
                        await ws.close()
                    except Exception:
                        status = "error"
                        self.log.exception("workspace close failed")
            if scope.cancelled_caught:
                status = "timeout"
                self.log.error("workspace close exceeded %.1fs; abandoned", self._close_timeout)
            self._state = "closed"
            had_workspace = bool(workspaces) or self._ref is not None
            if self._ref is not None:
                self._ref = None
                await self._persist_ref(None)
            if had_workspace:
                guarded("inc_close", self.metrics.inc_close, self.provider.provider_id, status)
                self._emit("on_close", status=status)

    # -- helpers --------------------------------------------------------------

    async def _persist_ref(self, ref: WorkspaceRef | None) -> None:
        if self._persist is None:
            return
        result = self._persist(ref)
        if inspect.isawaitable(result):
            await result

    def _emit(
        self,
        hook: str,
        *,
        workspace_id: str | None = None,
        status: str = "ok",
        detail: dict[str, Any] | None = None,
    ) -> None:
        if workspace_id is None and self._ws is not None:
            workspace_id = self._ws.id
        self.hooks.emit(
            WorkspaceEvent(
                hook=hook,
                session_id=self.session.session_id,
                provider_id=self.provider.provider_id,
                workspace_id=workspace_id,
                status=status,
                detail=detail or {},
            )
        )

    def emit(self, hook: str, *, status: str = "ok", detail: dict[str, Any] | None = None) -> None:
        """Fire a lifecycle hook on behalf of the tool layer (snapshot, eviction retry)."""
        self._emit(hook, status=status, detail=detail)
