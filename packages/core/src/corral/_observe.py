"""Metrics, lifecycle hooks and usage records that can never break an operation.

Metrics are synchronous counters and histograms; a raising metrics sink is
logged and ignored. Hooks may be plain functions (called inline, guarded)
or coroutine functions: those go through a bounded queue drained by the
registry's background task, so a slow hook delays nothing and a flood is
dropped and counted instead of piling up.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import anyio
import anyio.abc
import attrs
from anyio.streams.memory import MemoryObjectSendStream

__all__ = [
    "HOOK_NAMES",
    "HookDispatcher",
    "NoopMetrics",
    "UsageRecorder",
    "WorkspaceEvent",
    "WorkspaceHooks",
    "WorkspaceMetrics",
]

log = logging.getLogger("corral.observe")

HOOK_NAMES: Final = (
    "on_open",
    "on_close",
    "on_evicted",
    "on_eviction_retry",
    "on_snapshot",
)


class WorkspaceMetrics(Protocol):
    """Counters and histograms fired at every lifecycle point (all synchronous)."""

    def inc_open(self, provider: str, status: str) -> None:
        """An open or resolve settled (``ok``, ``failed``)."""
        ...

    def observe_open_latency_ms(self, provider: str, ms: float) -> None:
        """How long a successful open or resolve took."""
        ...

    def inc_close(self, provider: str, status: str) -> None:
        """A close settled (``ok``, ``timeout``, ``error``)."""
        ...

    def inc_eviction(self, provider: str) -> None:
        """A workspace was marked evicted."""
        ...

    def inc_eviction_retry(self, provider: str, outcome: str) -> None:
        """An eviction retry settled (``recovered``, ``exhausted``)."""
        ...

    def inc_tool_call(self, tool: str, status: str) -> None:
        """A tool call settled (``ok``, ``error``)."""
        ...

    def observe_tool_latency_ms(self, tool: str, ms: float) -> None:
        """How long a tool call took."""
        ...

    def inc_hook_dropped(self, hook: str) -> None:
        """An async hook event was dropped because its queue was full."""
        ...


class NoopMetrics:
    """Metrics that record nothing (the default)."""

    def inc_open(self, provider: str, status: str) -> None:
        """Ignore."""

    def observe_open_latency_ms(self, provider: str, ms: float) -> None:
        """Ignore."""

    def inc_close(self, provider: str, status: str) -> None:
        """Ignore."""

    def inc_eviction(self, provider: str) -> None:
        """Ignore."""

    def inc_eviction_retry(self, provider: str, outcome: str) -> None:
        """Ignore."""

    def inc_tool_call(self, tool: str, status: str) -> None:
        """Ignore."""

    def observe_tool_latency_ms(self, tool: str, ms: float) -> None:
        """Ignore."""

    def inc_hook_dropped(self, hook: str) -> None:
        """Ignore."""


class UsageRecorder(Protocol):
    """Receives one record per tool call: kind ``workspace.<op>`` and wall-clock ms."""

    def __call__(self, kind: str, duration_ms: float, *, session_id: str) -> None:
        """Record usage."""
        ...


@attrs.frozen
class WorkspaceEvent:
    """What a lifecycle hook receives.

    Attributes:
        hook: Which hook fired (``on_open``...).
        session_id: The owning session.
        provider_id: The provider.
        workspace_id: The workspace, when one is known.
        status: Outcome (``ok``, ``timeout``, ``recovered``, ``exhausted``, an op name...).
        detail: Extra facts (durations, snapshot ids).
    """

    hook: str
    session_id: str
    provider_id: str
    workspace_id: str | None = None
    status: str = "ok"
    detail: Mapping[str, Any] = attrs.field(factory=dict)


class WorkspaceHooks(Protocol):
    """Any object with some of the ``on_*`` methods; each may be sync or async."""


def guarded(name: str, fn: Callable[..., Any], *args: Any) -> None:
    """Call a metrics method; log and swallow anything it raises."""
    try:
        fn(*args)
    except Exception:
        log.warning("metrics sink %s raised; ignored", name, exc_info=True)


class HookDispatcher:
    """Delivers hook events: sync hooks inline, async hooks through a bounded queue.

    Args:
        hooks: Objects with ``on_*`` methods (sync or async).
        metrics: Counts dropped events.
        queue_size: Async events buffered before new ones are dropped.
        hook_timeout_s: An async hook running longer than this is cancelled.
    """

    def __init__(
        self,
        hooks: list[object],
        metrics: WorkspaceMetrics,
        *,
        queue_size: int = 256,
        hook_timeout_s: float = 5.0,
    ) -> None:
        self._hooks = hooks
        self._metrics = metrics
        self._timeout = hook_timeout_s
        self._queue_size = queue_size
        self._send: MemoryObjectSendStream[tuple[Callable[..., Any], WorkspaceEvent]] | None = None
        self._running = False
        self._drained = anyio.Event()
        self.dropped = 0

    @property
    def has_async(self) -> bool:
        """Whether any registered hook is a coroutine function."""
        return any(
            inspect.iscoroutinefunction(getattr(h, n, None))
            for h in self._hooks
            for n in HOOK_NAMES
        )

    def emit(self, event: WorkspaceEvent) -> None:
        """Deliver an event to every hook that handles it; never raises."""
        for hook in self._hooks:
            fn = getattr(hook, event.hook, None)
            if fn is None:
                continue
            if inspect.iscoroutinefunction(fn):
                self._enqueue(fn, event)
                continue
            try:
                fn(event)
            except Exception:
                log.warning("workspace hook %s raised; ignored", event.hook, exc_info=True)

    def _enqueue(self, fn: Callable[..., Any], event: WorkspaceEvent) -> None:
        if not self._running or self._send is None:
            self._drop(event, "no dispatcher is running (enter the registry with 'async with')")
            return
        try:
            self._send.send_nowait((fn, event))
        except anyio.WouldBlock:
            self._drop(event, "queue full")

    def _drop(self, event: WorkspaceEvent, why: str) -> None:
        self.dropped += 1
        guarded("inc_hook_dropped", self._metrics.inc_hook_dropped, event.hook)
        if self.dropped == 1 or math.log2(self.dropped).is_integer():
            log.warning(
                "async workspace hook %s dropped (%s); %d dropped so far",
                event.hook,
                why,
                self.dropped,
            )

    async def drain(self, scope: anyio.CancelScope) -> None:
        """Stop accepting events, deliver the queued ones (bounded), then stop."""
        self._running = False
        if self._send is not None:
            self._send.close()
        with anyio.move_on_after(self._timeout, shield=True):
            await self._drained.wait()
        scope.cancel()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Drain the queue until cancelled."""
        send, recv = anyio.create_memory_object_stream[tuple[Callable[..., Any], WorkspaceEvent]](
            self._queue_size
        )
        self._send = send
        self._running = True
        self._drained = anyio.Event()
        task_status.started()
        try:
            async for fn, event in recv:
                with anyio.move_on_after(self._timeout) as scope:
                    try:
                        await fn(event)
                    except Exception:
                        log.warning(
                            "async workspace hook %s raised; ignored", event.hook, exc_info=True
                        )
                if scope.cancelled_caught:
                    log.warning(
                        "async workspace hook %s exceeded %.1fs; cancelled",
                        event.hook,
                        self._timeout,
                    )
        finally:
            self._running = False
            self._send = None
            send.close()
            recv.close()
            self._drained.set()
