"""WorkspaceRegistry: lifecycle, contract checks, retries, hooks and metrics."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

import corral
from corral import SessionRef, WorkspaceFailedError, WorkspaceRegistry
from corral.testing import RecordingHooks

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
    hooks = RecordingHooks()
    reg = registry(provider, make_config(), hooks=[hooks])
    ws = await reg.get()
    reg.mark_evicted()
    assert reg.state == "evicted"
    assert (await reg.get()).id == ws.id
    assert provider.resolves == 1
    assert hooks.names() == ["on_open", "on_evicted", "on_open"]


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


class Exploding:
    def on_open(self, event: Any) -> None:
        raise RuntimeError("hook bug")

    def inc_open(self, provider: str, status: str) -> None:
        raise RuntimeError("metrics bug")


async def test_raising_hooks_and_metrics_never_break_open(
    provider: Any, make_config: Any, caplog: pytest.LogCaptureFixture
) -> None:
    boom = Exploding()
    metrics = corral.NoopMetrics()
    metrics.inc_open = boom.inc_open  # type: ignore[method-assign]
    reg = registry(provider, make_config(), hooks=[boom], metrics=metrics)
    with caplog.at_level(logging.WARNING):
        await reg.get()
    assert reg.state == "open"
    assert "hook on_open raised" in caplog.text
    assert "metrics sink inc_open raised" in caplog.text


class SlowAsyncHooks:
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def on_open(self, event: Any) -> None:
        self.seen.append(event.hook)
        await anyio.sleep_forever()

    async def on_close(self, event: Any) -> None:
        self.seen.append(event.hook)


async def test_hanging_async_hook_does_not_stall_operations(
    provider: Any, make_config: Any
) -> None:
    hooks = SlowAsyncHooks()
    reg = registry(provider, make_config(), hooks=[hooks])
    reg.hooks._timeout = 0.05
    with anyio.fail_after(5):
        async with reg:
            await reg.get()
            await anyio.sleep(0.2)
    assert hooks.seen == ["on_open", "on_close"]


class CountingAsyncHooks:
    def __init__(self) -> None:
        self.count = 0
        self.release = anyio.Event()

    async def on_evicted(self, event: Any) -> None:
        await self.release.wait()
        self.count += 1


async def test_async_hook_queue_drops_and_counts_when_full(provider: Any, make_config: Any) -> None:
    hooks = CountingAsyncHooks()
    reg = registry(provider, make_config(), hooks=[hooks])
    async with reg:
        await reg.get()
        for _ in range(400):
            reg.mark_evicted()
            await reg.get()
        hooks.release.set()
    assert reg.hooks.dropped > 0
    assert reg.describe().hooks_dropped == reg.hooks.dropped
    assert hooks.count + reg.hooks.dropped == 400


async def test_async_hooks_without_dispatcher_are_dropped_not_awaited(
    provider: Any, make_config: Any
) -> None:
    hooks = SlowAsyncHooks()
    reg = registry(provider, make_config(), hooks=[hooks])
    with anyio.fail_after(5):
        await reg.get()
    assert hooks.seen == []
    assert reg.hooks.dropped == 1


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
