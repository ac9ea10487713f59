"""One observation channel: typed events, and the sinks that receive them.

The registry and the tool layer report everything an operator may want to
see -- a tool call finished, a workspace opened, failed, was evicted or
closed, a state changed, an eviction was retried -- as frozen :class:`Event`
objects through one ``emit(event)`` path. Metrics, usage records and logs
are *sinks* subscribed to that stream (:class:`MetricsSink`,
:class:`UsageSink`, :class:`LogSink`), and so is anything a user passes as
an observer. One stream instead of four channels means a new event reaches
every sink without touching the code that emits it.

A sink can never break or stall an operation. A plain function is called
inline, and whatever it raises is logged and ignored (keep such sinks fast:
they run on the caller's task). A coroutine function goes through a bounded
queue drained by a background task while the stream runs
(:meth:`EventStream.running`); each delivery is bounded by a timeout, and
when the queue is full the event is dropped and counted instead of piling
up.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Final, Literal, Protocol, cast

import anyio
import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = [
    "AsyncEventSink",
    "CapabilityEvent",
    "Event",
    "EventSink",
    "EventStream",
    "EventsDropped",
    "EvictionRetried",
    "LogSink",
    "MetricsSink",
    "OpenRetrying",
    "RegistryState",
    "StateChanged",
    "SyncEventSink",
    "ToolCallFinished",
    "UsageRecorder",
    "UsageSink",
    "WorkspaceClosed",
    "WorkspaceEvicted",
    "WorkspaceMetrics",
    "WorkspaceOpenFailed",
    "WorkspaceOpened",
    "log_extra",
]

log = logging.getLogger("corral.observe")

RegistryState = Literal["configured", "opening", "open", "closing", "closed", "failed", "evicted"]
"""The lifecycle states of a session's workspace (see ``WorkspaceRegistry``)."""

ToolStatus = Literal["ok", "error", "cancelled"]
CloseStatus = Literal["ok", "timeout", "error"]
RetryOutcome = Literal["recovered", "exhausted"]

# -- events --------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Event:
    """What every event carries: the session and provider it concerns.

    Sinks receive subclasses; match on the type (``isinstance`` or ``match``).

    Attributes:
        session_id: The owning session.
        provider_id: The session's provider.
    """

    session_id: str
    provider_id: str


@attrs.frozen(kw_only=True)
class ToolCallFinished(Event):
    """A tool call settled (the usage record, the tool metrics and log line).

    Attributes:
        tool: The tool name (``workspace_read_file``).
        op: Its usage name (``read_file``: the usage kind is ``workspace.<op>``).
        capability: The capability that contributed the tool.
        status: ``ok``, ``error`` (an error result) or ``cancelled``.
        duration_ms: Wall-clock time of the call, validation included.
        error_code: The error result's code, when ``status`` is ``error``.
        trace: The tool set's trace context (trace and span ids), for correlation.
    """

    tool: str
    op: str
    capability: str
    status: ToolStatus
    duration_ms: float
    error_code: str | None = None
    trace: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class WorkspaceOpened(Event):
    """An open (or a resolve of a persisted ref) succeeded.

    Attributes:
        workspace_id: The live workspace.
        resolved: True for a resolve of an existing ref, False for a new workspace.
        duration_ms: How long the provider took (contract checks included).
    """

    workspace_id: str
    resolved: bool
    duration_ms: float


@attrs.frozen(kw_only=True)
class WorkspaceOpenFailed(Event):
    """One open or resolve attempt failed.

    Attributes:
        resolved: Whether it was a resolve of an existing ref.
        error: The provider's bare message (never the untrusted payload).
        transient: Whether the failure may be retried.
        duration_ms: How long the attempt took.
    """

    resolved: bool
    error: str
    transient: bool
    duration_ms: float


@attrs.frozen(kw_only=True)
class OpenRetrying(Event):
    """A transient open/resolve failure will be retried after a backoff.

    Attributes:
        attempt: The retry about to happen (1-based).
        max_attempts: Retries allowed in total.
        delay_s: The backoff before it.
    """

    attempt: int
    max_attempts: int
    delay_s: float


@attrs.frozen(kw_only=True)
class StateChanged(Event):
    """The registry moved from one lifecycle state to another.

    Attributes:
        previous: The state it left.
        current: The state it entered.
    """

    previous: RegistryState
    current: RegistryState


@attrs.frozen(kw_only=True)
class WorkspaceEvicted(Event):
    """A module reported the workspace's backing resource gone; the next use re-resolves.

    Attributes:
        workspace_id: The workspace that was evicted.
    """

    workspace_id: str | None


@attrs.frozen(kw_only=True)
class EvictionRetried(Event):
    """A tool call that hit an eviction was retried once against the re-resolved workspace.

    Attributes:
        tool: The tool whose call was retried.
        outcome: ``recovered`` or ``exhausted`` (evicted again).
        trace: The tool set's trace context.
    """

    tool: str
    outcome: RetryOutcome
    trace: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class WorkspaceClosed(Event):
    """The session's workspace (and any it replaced) was closed.

    Attributes:
        workspace_id: The live workspace at close time, if there was one.
        status: ``ok``, ``timeout`` (abandoned after the close timeout) or ``error``.
        duration_ms: How long closing took.
    """

    workspace_id: str | None
    status: CloseStatus
    duration_ms: float


@attrs.frozen(kw_only=True)
class CapabilityEvent(Event):
    """Something a capability's tool reported through ``env.session.emit`` (a snapshot...).

    Attributes:
        capability: The reporting capability (``snapshot``).
        name: What happened, a lowercase identifier (``snapshot``).
        status: Its outcome or kind (``ok``, ``restore``, ``branch``).
        detail: Small string facts (``{"snapshot_id": ...}``).
    """

    capability: str
    name: str
    status: str = "ok"
    detail: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class EventsDropped(Event):
    """An event for an async sink was dropped (its queue was full or not running).

    Delivered to synchronous sinks only: reporting a drop must never queue
    another event behind the one that was dropped.

    Attributes:
        sink: The name of the sink that missed the event.
        event_type: The dropped event's class name.
        reason: Why (``queue full``, ``not running``).
        dropped: Events dropped by this stream so far.
    """

    sink: str
    event_type: str
    reason: str
    dropped: int


# -- sinks ---------------------------------------------------------------------

SyncEventSink = Callable[[Event], None]
"""A sink called inline; it must be fast (it runs on the emitting task)."""

AsyncEventSink = Callable[[Event], Awaitable[None]]
"""A sink awaited by the stream's background task, through a bounded queue."""

EventSink = SyncEventSink | AsyncEventSink
"""Anything that receives events: a plain or a coroutine function (or callable object)."""


def _is_async(sink: object) -> bool:
    # A callable object with an ``async def __call__`` is async too.
    return inspect.iscoroutinefunction(sink) or inspect.iscoroutinefunction(type(sink).__call__)


def _sink_name(sink: object) -> str:
    name = getattr(sink, "__qualname__", None)
    return name if isinstance(name, str) else type(sink).__qualname__


def _first_or_power_of_two(n: int) -> bool:
    """Whether the n-th repeat of a warning is worth logging (1, 2, 4, 8...)."""
    return n >= 1 and math.log2(n).is_integer()


class EventStream:
    """Delivers each emitted event to every sink, isolated from the emitter.

    Args:
        sinks: Sinks subscribed from the start (sync or async callables).
        queue_size: Async deliveries buffered before new ones are dropped.
        sink_timeout_s: An async sink running longer than this on one event
            is cancelled.
    """

    def __init__(
        self,
        sinks: Iterable[EventSink] = (),
        *,
        queue_size: int = 256,
        sink_timeout_s: float = 5.0,
    ) -> None:
        self._sync: list[SyncEventSink] = []
        self._async: list[AsyncEventSink] = []
        self._ignorers: list[Callable[[], bool]] | None = []
        self._failures: dict[str, int] = {}
        self._queue_size = queue_size
        self.sink_timeout_s = sink_timeout_s
        self._send: MemoryObjectSendStream[tuple[AsyncEventSink, Event]] | None = None
        self._drained = anyio.Event()
        self.dropped = 0
        for sink in sinks:
            self.subscribe(sink)

    def subscribe(self, sink: EventSink) -> None:
        """Add a sink; whether it is awaited is decided once, here."""
        if _is_async(sink):
            self._async.append(sink)  # type: ignore[arg-type]  # checked by _is_async
        else:
            self._sync.append(sink)  # type: ignore[arg-type]  # checked by _is_async
        # Decided per subscription, not per call: who may ignore ok tool calls.
        ignorers = [getattr(s, "ignores_ok_tool_calls", None) for s in self._sync]
        self._ignorers = (
            None if self._async or None in ignorers else cast(list[Callable[[], bool]], ignorers)
        )

    @property
    def has_async(self) -> bool:
        """Whether some sink needs the background task of :meth:`running`."""
        return bool(self._async)

    def observes_ok_tool_calls(self) -> bool:
        """Whether some sink would act on a successful :class:`ToolCallFinished`.

        True unless every sink is synchronous and says it would ignore one
        (a sink says so with a ``ignores_ok_tool_calls()`` method returning
        True, as :class:`LogSink` does while DEBUG is off): building and
        delivering an event per call that nobody reads was a measurable
        share of the tool layer's overhead.
        """
        ignorers = self._ignorers
        if ignorers is None:
            return True
        # A loop, not any(genexpr): this runs on every tool call, and the
        # generator cost more than the one check it wraps.
        for ignores in ignorers:  # noqa: SIM110
            if not ignores():
                return True
        return False

    def emit(self, event: Event) -> None:
        """Deliver ``event`` to every sink; never raises, never waits."""
        for sink in self._sync:
            try:
                sink(event)
            except Exception:
                self._sink_failed(sink)
        for asink in self._async:
            self._enqueue(asink, event)

    def _sink_failed(self, sink: object) -> None:
        name = _sink_name(sink)
        failures = self._failures.get(name, 0) + 1
        self._failures[name] = failures
        if _first_or_power_of_two(failures):
            log.warning(
                "event sink %s raised; ignored (%d failures so far)",
                name,
                failures,
                exc_info=True,
            )

    def _enqueue(self, sink: AsyncEventSink, event: Event) -> None:
        if self._send is None:
            self._drop(sink, event, "not running (enter the registry with 'async with')")
            return
        try:
            self._send.send_nowait((sink, event))
        except anyio.WouldBlock:
            self._drop(sink, event, "queue full")

    def _drop(self, sink: AsyncEventSink, event: Event, reason: str) -> None:
        self.dropped += 1
        report = EventsDropped(
            session_id=event.session_id,
            provider_id=event.provider_id,
            sink=_sink_name(sink),
            event_type=type(event).__name__,
            reason=reason,
            dropped=self.dropped,
        )
        for sync in self._sync:
            try:
                sync(report)
            except Exception:
                self._sink_failed(sync)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Deliver to async sinks for the duration of the block.

        Needed only when some sink is async; without it their events are
        dropped and counted. On exit the stream stops accepting events and
        delivers what is queued, bounded by ``sink_timeout_s``.
        """
        if not self._async or self._send is not None:
            yield
            return
        send, recv = anyio.create_memory_object_stream[tuple[AsyncEventSink, Event]](
            self._queue_size
        )
        self._drained = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._deliver, recv)
            self._send = send
            try:
                yield
            finally:
                self._send = None
                send.close()
                with anyio.move_on_after(self.sink_timeout_s, shield=True):
                    await self._drained.wait()
                tg.cancel_scope.cancel()

    async def _deliver(self, recv: MemoryObjectReceiveStream[tuple[AsyncEventSink, Event]]) -> None:
        try:
            async for sink, event in recv:
                with anyio.move_on_after(self.sink_timeout_s) as scope:
                    try:
                        await sink(event)
                    except Exception:
                        self._sink_failed(sink)
                if scope.cancelled_caught:
                    log.warning(
                        "event sink %s exceeded %.1fs on %s; cancelled",
                        _sink_name(sink),
                        self.sink_timeout_s,
                        type(event).__name__,
                    )
        finally:
            recv.close()
            self._drained.set()


# -- adapters: metrics, usage, logs as sinks -------------------------------------


class WorkspaceMetrics(Protocol):
    """Counters and histograms, fed by :class:`MetricsSink` (all synchronous).

    Any object with these methods will do. Subclass the protocol explicitly to
    implement only some of them: the others then count nothing.
    """

    def inc_open(self, provider: str, status: str) -> None:
        """An open or resolve attempt settled (``ok``, ``failed``)."""
        return

    def observe_open_latency_ms(self, provider: str, ms: float) -> None:
        """How long a successful open or resolve took."""
        return

    def inc_close(self, provider: str, status: str) -> None:
        """A close settled (``ok``, ``timeout``, ``error``)."""
        return

    def inc_eviction(self, provider: str) -> None:
        """A workspace was marked evicted."""
        return

    def inc_eviction_retry(self, provider: str, outcome: str) -> None:
        """An eviction retry settled (``recovered``, ``exhausted``)."""
        return

    def inc_tool_call(self, tool: str, status: str) -> None:
        """A tool call settled (``ok``, ``error``, ``cancelled``)."""
        return

    def observe_tool_latency_ms(self, tool: str, ms: float) -> None:
        """How long a tool call took."""
        return

    def inc_events_dropped(self, sink: str) -> None:
        """An event for an async sink was dropped (queue full or not running)."""
        return


class MetricsSink:
    """Feeds a :class:`WorkspaceMetrics` from the event stream.

    Args:
        metrics: The counters and histograms to feed.
    """

    __slots__ = ("_metrics",)

    def __init__(self, metrics: WorkspaceMetrics) -> None:
        self._metrics = metrics

    def __call__(self, event: Event) -> None:
        """Translate one event into counter and histogram updates."""
        m = self._metrics
        if isinstance(event, ToolCallFinished):
            m.inc_tool_call(event.tool, event.status)
            m.observe_tool_latency_ms(event.tool, event.duration_ms)
        elif isinstance(event, WorkspaceOpened):
            m.inc_open(event.provider_id, "ok")
            m.observe_open_latency_ms(event.provider_id, event.duration_ms)
        elif isinstance(event, WorkspaceOpenFailed):
            m.inc_open(event.provider_id, "failed")
        elif isinstance(event, WorkspaceClosed):
            m.inc_close(event.provider_id, event.status)
        elif isinstance(event, WorkspaceEvicted):
            m.inc_eviction(event.provider_id)
        elif isinstance(event, EvictionRetried):
            m.inc_eviction_retry(event.provider_id, event.outcome)
        elif isinstance(event, EventsDropped):
            m.inc_events_dropped(event.sink)


class UsageRecorder(Protocol):
    """Receives one record per tool call: kind ``workspace.<op>`` and wall-clock ms."""

    def __call__(self, kind: str, duration_ms: float, *, session_id: str) -> None:
        """Record usage."""
        ...


class UsageSink:
    """Feeds a :class:`UsageRecorder` one record per finished tool call.

    Args:
        recorder: Where usage goes (billing, quotas).
    """

    __slots__ = ("_recorder",)

    def __init__(self, recorder: UsageRecorder) -> None:
        self._recorder = recorder

    def __call__(self, event: Event) -> None:
        """Record a :class:`ToolCallFinished`; ignore every other event."""
        if isinstance(event, ToolCallFinished):
            self._recorder(f"workspace.{event.op}", event.duration_ms, session_id=event.session_id)


_RESERVED_LOG_KEYS: Final = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def log_extra(trace: Mapping[str, str]) -> dict[str, object]:
    """The trace context as ``extra``; keys a LogRecord owns get a ``trace_`` prefix."""
    return {(k if k not in _RESERVED_LOG_KEYS else f"trace_{k}"): v for k, v in trace.items()}


class LogSink:
    """Writes events as log records: the operator's view of the same stream.

    Tool calls go to ``tools_logger`` (DEBUG when ok, INFO otherwise) with the
    trace context, tool, status and duration as record attributes; lifecycle
    events go to ``logger``.

    Args:
        logger: Where lifecycle records go (``corral.registry``).
        tools_logger: Where tool-call records go (``corral.tools``).
    """

    __slots__ = ("_log", "_tools")

    def __init__(
        self, logger: logging.Logger | None = None, tools_logger: logging.Logger | None = None
    ) -> None:
        self._log = logger or logging.getLogger("corral.registry")
        self._tools = tools_logger or logging.getLogger("corral.tools")

    def ignores_ok_tool_calls(self) -> bool:
        """True while the tools logger drops DEBUG records (ok calls log at DEBUG)."""
        return not self._tools.isEnabledFor(logging.DEBUG)

    def __call__(self, event: Event) -> None:
        """Log one event at the level it deserves (most are DEBUG)."""
        if isinstance(event, ToolCallFinished):
            self._tool_call(event)
        elif isinstance(event, WorkspaceOpenFailed):
            self._log.warning(
                "workspace %s failed: %s", "resolve" if event.resolved else "open", event.error
            )
        elif isinstance(event, OpenRetrying):
            self._log.warning(
                "workspace registry: transient failure, retry %d/%d in %.2fs",
                event.attempt,
                event.max_attempts,
                event.delay_s,
            )
        elif isinstance(event, WorkspaceClosed) and event.status == "timeout":
            self._log.error("workspace close exceeded %.0fms; abandoned", event.duration_ms)
        elif isinstance(event, EvictionRetried) and event.outcome == "exhausted":
            self._tools.error(
                "workspace tool %s: eviction retry exhausted",
                event.tool,
                extra=log_extra(event.trace),
            )
        elif isinstance(event, EventsDropped):
            if _first_or_power_of_two(event.dropped):
                self._log.warning(
                    "event for async sink %s dropped (%s); %d dropped so far",
                    event.sink,
                    event.reason,
                    event.dropped,
                )
        elif self._log.isEnabledFor(logging.DEBUG):
            self._log.debug("workspace event %r", event)

    def _tool_call(self, event: ToolCallFinished) -> None:
        ok = event.status == "ok"
        level = logging.DEBUG if ok else logging.INFO
        if not self._tools.isEnabledFor(level):
            return
        self._tools.log(
            level,
            "workspace tool %s %s in %.2fms%s",
            event.tool,
            event.status,
            event.duration_ms,
            f" ({event.error_code})" if event.error_code else "",
            extra={
                **log_extra(event.trace),
                "corral_tool": event.tool,
                "corral_status": event.status,
                "corral_duration_ms": event.duration_ms,
            },
        )
