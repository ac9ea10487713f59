"""WorkspaceRegistry: lifecycle, contract checks, retries, and its event stream."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

import corral
from corral import SessionRef, WorkspaceFailedError, WorkspaceRegistry
from corral.testing import RecordingObserver

pytestmark = pytest.mark.anyio

SESSION = SessionRef("s1")


def registry(provider: Any, config: corral.WorkspaceConfig, **kwargs: Any) -> WorkspaceRegistry:
    return WorkspaceRegistry(config, SESSION, provider, **kwargs)


async def test_lazy_open_happens_on_first_get(provider: Any, make_config: Any) -> None:
    reg = registry(provider, make_config())
    assert reg.state == "configured"
    assert provider.opens == 0
    ws = await reg.get()
    assert reg.state == "open"
    assert provider.opens == 1
    assert (await reg.get()).id == ws.id
    assert provider.opens == 1


async def test_concurrent_gets_open_once(provider: Any, make_config: Any) -> None:
    reg = registry(provider, make_config())
    ids: list[str] = []

    async def get() -> None:
        ids.append((await reg.get()).id)

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(get)
    assert provider.opens == 1
    assert len(set(ids)) == 1


async def test_persist_callback_gets_ref_then_none(provider: Any, make_config: Any) -> None:
    seen: list[corral.WorkspaceRef | None] = []

    async def persist(ref: corral.WorkspaceRef | None) -> None:
        seen.append(ref)

    reg = registry(provider, make_config(), persist_ref=persist)
    await reg.get()
    await reg.close()
    assert seen[0] is not None
    assert seen[0].provider_id == "fake"
    assert seen[-1] is None


async def test_resolve_uses_the_persisted_ref(provider: Any, make_config: Any) -> None:
    first = registry(provider, make_config())
    ws = await first.get()
    ref = first.ref
    assert ref is not None
    second = registry(provider, make_config(), ref=ref)
    assert (await second.get()).id == ws.id
    assert provider.opens == 1
    assert provider.resolves == 1


async def test_lost_workspace_fails_and_never_opens_fresh(provider: Any, make_config: Any) -> None:
    ref = corral.WorkspaceRef("fake", {"id": "ws-gone"}, {"fs"}, 2)
    reg = registry(provider, make_config(), ref=ref)
    with pytest.raises(WorkspaceFailedError, match="gone"):
        await reg.get()
    assert reg.state == "failed"
    assert provider.opens == 0
    # A failed entry fails fast with the same error, without calling the provider again.
    with pytest.raises(WorkspaceFailedError, match="gone"):
        await reg.get()
    assert provider.resolves == 1
    reg.reset(discard_ref=True)
    await reg.get()
    assert provider.opens == 1


async def test_transient_failures_are_retried(
    provider: Any, make_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    delays: list[float] = []

    async def fake_sleep(delay: float) -> None:
        delays.append(delay)

    monkeypatch.setattr("corral._registry.anyio.sleep", fake_sleep)
    provider.fail_transient = 2
    reg = registry(provider, make_config())
    await reg.get()
    assert provider.opens == 3
    assert len(delays) == 2
    assert delays[1] > 0
    assert sum(delays) <= 10.0


async def test_transient_retries_are_bounded(
    provider: Any, make_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def fake_sleep(delay: float) -> None:
        return None

    monkeypatch.setattr("corral._registry.anyio.sleep", fake_sleep)
    provider.fail_transient = 100
    reg = registry(provider, make_config(), transient_retry_attempts=3)
    with pytest.raises(WorkspaceFailedError, match="busy"):
        await reg.get()
    assert provider.opens == 4
    assert reg.state == "failed"


async def test_permanent_failure_is_not_retried(provider: Any, make_config: Any) -> None:
    provider.fail_permanent = True
    reg = registry(provider, make_config())
    with pytest.raises(WorkspaceFailedError, match="refused"):
        await reg.get()
    assert provider.opens == 1
    assert reg.describe().last_error == "backend refused"


async def test_reset_after_cooldown_reopens(provider: Any, make_config: Any) -> None:
    provider.fail_permanent = True
    reg = registry(provider, make_config(), reset_after_s=0.0)
    with pytest.raises(WorkspaceFailedError):
        await reg.get()
    provider.fail_permanent = False
    await reg.get()
    assert reg.state == "open"


async def test_declared_capability_not_advertised_fails_at_open(
    provider: Any, make_config: Any
) -> None:
    provider.advertise = frozenset({"fs"})
    reg = registry(provider, make_config({"fs": True, "shell": True}))
    with pytest.raises(
        WorkspaceFailedError, match="does not advertise declared capabilities: shell"
    ):
        await reg.get()


async def test_declared_module_missing_fails_at_open(provider: Any, make_config: Any) -> None:
    provider.capabilities = frozenset({"fs"})
    provider.advertise = frozenset({"fs", "shell"})  # lies: advertises shell, builds none
    reg = registry(provider, make_config({"fs": True, "shell": True}))
    with pytest.raises(WorkspaceFailedError, match="without declared modules: shell"):
        await reg.get()


async def test_contract_is_checked_again_at_resolve(provider: Any, make_config: Any) -> None:
    ref = corral.WorkspaceRef("fake", {"id": "ws-x"}, {"fs"}, 2)
    provider.stores["ws-x"] = {}
    reg = registry(provider, make_config({"fs": True, "shell": True}), ref=ref)
    with pytest.raises(WorkspaceFailedError, match="does not advertise declared capabilities"):
        await reg.get()


async def test_least_privilege_hides_undeclared_modules(provider: Any, make_config: Any) -> None:
    reg = registry(provider, make_config({"fs": True}))
    ws = await reg.get()
    assert ws.fs is not None
    assert ws.shell is None
    assert ws.module("shell") is None
    with pytest.raises(WorkspaceFailedError, match=r"declare capabilities\.shell"):
        ws.require("shell")


async def test_close_is_idempotent_and_final(provider: Any, make_config: Any) -> None:
    reg = registry(provider, make_config())
    await reg.get()
    await reg.close()
    await reg.close()
    assert provider.calls.count("close") == 1
    assert reg.state == "closed"
    with pytest.raises(WorkspaceFailedError, match="closed"):
        await reg.get()


async def test_close_timeout_is_bounded(provider: Any, make_config: Any) -> None:
    provider.hang_close = True
    reg = registry(provider, make_config(), close_timeout_s=0.05)
    await reg.get()
    with anyio.fail_after(5):
        await reg.close()
    assert reg.state == "closed"


async def test_swap_ref_moves_to_new_workspace_and_closes_both_at_end(
    provider: Any, make_config: Any
) -> None:
    reg = registry(provider, make_config())
    first = await reg.get()
    other = registry(provider, make_config())
    second_id = (await other.get()).id
    new_ref = other.ref
    assert new_ref is not None
    await reg.swap_ref(new_ref)
    assert (await reg.get()).id == second_id
    assert reg.ref == new_ref
    await reg.close()
    assert first.id not in provider.stores
    assert second_id not in provider.stores


async def test_swap_ref_refuses_foreign_ref(provider: Any, make_config: Any) -> None:
    reg = registry(provider, make_config())
    await reg.get()
    with pytest.raises(WorkspaceFailedError, match="another provider"):
        await reg.swap_ref(corral.WorkspaceRef("other", {}, {"fs"}, 2))


async def test_mark_evicted_then_get_resolves(provider: Any, make_config: Any) -> None:
    seen = RecordingObserver()
    reg = registry(provider, make_config(), observers=[seen])
    ws = await reg.get()
    reg.mark_evicted()
    assert reg.state == "evicted"
    assert (await reg.get()).id == ws.id
    assert provider.resolves == 1
    lifecycle = [n for n in seen.names() if n != "StateChanged"]
    assert lifecycle == ["WorkspaceOpened", "WorkspaceEvicted", "WorkspaceOpened"]
    first, evicted, second = (e for e in seen.events if not isinstance(e, corral.StateChanged))
    assert isinstance(first, corral.WorkspaceOpened)
    assert not first.resolved
    assert isinstance(evicted, corral.WorkspaceEvicted)
    assert evicted.workspace_id == ws.id
    assert isinstance(second, corral.WorkspaceOpened)
    assert second.resolved
    assert all((e.session_id, e.provider_id) == ("s1", "fake") for e in seen.events)


async def test_every_state_transition_is_an_event(provider: Any, make_config: Any) -> None:
    seen = RecordingObserver()
    reg = registry(provider, make_config(), observers=[seen])
    await reg.get()
    reg.mark_evicted()
    await reg.close()
    moves = [(e.previous, e.current) for e in seen.of_type(corral.StateChanged)]
    assert moves == [
        ("configured", "opening"),
        ("opening", "open"),
        ("open", "evicted"),
        ("evicted", "closing"),
        ("closing", "closed"),
    ]
    (closed,) = seen.of_type(corral.WorkspaceClosed)
    assert closed.status == "ok"
    assert closed.duration_ms >= 0


async def test_metrics_are_a_sink_of_the_event_stream(provider: Any, make_config: Any) -> None:
    calls: list[tuple[str, tuple[object, ...]]] = []

    class Counting(corral.WorkspaceMetrics):
        # Only some methods: the protocol's own bodies make the others no-ops.
        def inc_open(self, provider: str, status: str) -> None:
            calls.append(("inc_open", (provider, status)))

        def inc_close(self, provider: str, status: str) -> None:
            calls.append(("inc_close", (provider, status)))

        def inc_eviction(self, provider: str) -> None:
            calls.append(("inc_eviction", (provider,)))

    reg = registry(provider, make_config(), observers=[corral.MetricsSink(Counting())])
    await reg.get()
    reg.mark_evicted()
    await reg.get()
    await reg.close()
    assert calls == [
        ("inc_open", ("fake", "ok")),
        ("inc_eviction", ("fake",)),
        ("inc_open", ("fake", "ok")),
        ("inc_close", ("fake", "ok")),
    ]


async def test_failed_open_and_retries_are_events(provider: Any, make_config: Any) -> None:
    seen = RecordingObserver()
    provider.fail_transient = 1
    reg = registry(provider, make_config(), observers=[seen])
    await reg.get()
    (failed,) = seen.of_type(corral.WorkspaceOpenFailed)
    assert failed.transient
    assert failed.error == "backend busy"
    (retry,) = seen.of_type(corral.OpenRetrying)
    assert (retry.attempt, retry.max_attempts) == (1, 3)


async def test_describe_is_a_frozen_snapshot(provider: Any, make_config: Any) -> None:
    reg = registry(provider, make_config())
    before = reg.describe()
    assert before.state == "configured"
    assert before.workspace_id is None
    await reg.get()
    after = reg.describe()
    assert after.state == "open"
    assert after.workspace_id is not None
    assert after.opened_at is not None
    assert before.state == "configured"


def exploding_observer(event: corral.Event) -> None:
    raise RuntimeError("observer bug")


class ExplodingMetrics(corral.WorkspaceMetrics):
    def inc_open(self, provider: str, status: str) -> None:
        raise RuntimeError("metrics bug")


async def test_raising_observers_and_metrics_never_break_open(
    provider: Any, make_config: Any, caplog: pytest.LogCaptureFixture
) -> None:
    seen = RecordingObserver()
    observers = [exploding_observer, corral.MetricsSink(ExplodingMetrics()), seen]
    reg = registry(provider, make_config(), observers=observers)
    with caplog.at_level(logging.WARNING):
        await reg.get()
        await reg.close()
    assert reg.state == "closed"
    assert "event sink exploding_observer raised" in caplog.text
    assert "event sink MetricsSink raised" in caplog.text
    # A failing sink does not stop the ones after it.
    assert "WorkspaceOpened" in seen.names()
    assert "WorkspaceClosed" in seen.names()
    # Repeated failures are logged at 1, 2, 4, 8... not on every event.
    assert caplog.text.count("event sink exploding_observer raised") < len(seen.events)


class SlowAsyncObserver:
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, event: corral.Event) -> None:
        if isinstance(event, corral.WorkspaceOpened):
            self.seen.append("opened")
            await anyio.sleep_forever()
        if isinstance(event, corral.WorkspaceClosed):
            self.seen.append("closed")


async def test_hanging_async_observer_does_not_stall_operations(
    provider: Any, make_config: Any
) -> None:
    slow = SlowAsyncObserver()
    reg = registry(provider, make_config(), observers=[slow])
    reg._events.sink_timeout_s = 0.05
    with anyio.fail_after(5):
        async with reg:
            await reg.get()
            await anyio.sleep(0.2)
    assert slow.seen == ["opened", "closed"]


class CountingAsyncObserver:
    def __init__(self) -> None:
        self.received = 0
        self.release = anyio.Event()

    async def __call__(self, event: corral.Event) -> None:
        await self.release.wait()
        self.received += 1


async def test_async_observer_queue_drops_and_counts_when_full(
    provider: Any, make_config: Any
) -> None:
    counting = CountingAsyncObserver()
    seen = RecordingObserver()
    reg = registry(provider, make_config(), observers=[counting, seen])
    async with reg:
        await reg.get()
        for _ in range(400):
            reg.mark_evicted()
            await reg.get()
        counting.release.set()
    dropped = reg.describe().events_dropped
    assert dropped > 0
    reports = seen.of_type(corral.EventsDropped)
    # Every event reached the async sink or was counted as dropped, and each
    # drop was reported to the synchronous sinks (never queued behind itself).
    assert counting.received + dropped == len(seen.events) - len(reports)
    assert [d.dropped for d in reports] == list(range(1, dropped + 1))
    assert all(d.sink == "CountingAsyncObserver" and d.reason == "queue full" for d in reports)


async def test_async_observers_without_a_running_stream_are_dropped_not_awaited(
    provider: Any, make_config: Any
) -> None:
    slow = SlowAsyncObserver()
    reg = registry(provider, make_config(), observers=[slow])
    with anyio.fail_after(5):
        await reg.get()
    assert slow.seen == []
    assert reg.describe().events_dropped == 3  # two state changes and the open


async def test_provider_kind_mismatch_is_refused(provider: Any) -> None:
    config = corral.WorkspaceConfig(corral.ProviderConfig("other"), {"fs": True})
    with pytest.raises(WorkspaceFailedError, match="cannot serve"):
        WorkspaceRegistry(config, SESSION, provider)


async def test_unexpected_provider_exception_is_wrapped(provider: Any, make_config: Any) -> None:
    async def broken_open(*args: Any) -> Any:
        raise KeyError("internal")

    provider.open = broken_open
    reg = registry(provider, make_config())
    with pytest.raises(WorkspaceFailedError, match="KeyError") as info:
        await reg.get()
    assert isinstance(info.value.cause, KeyError)
