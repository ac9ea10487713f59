"""Materializations: one live box, resumed after a restart, leases between holders, idle stop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from corral_server import ServiceError, WorkspaceService
from server_support import SANDBOX, ProcessMemoryProvider, make_service

pytestmark = pytest.mark.anyio


async def _setup(tmp_path: Path, provider: Any, **kw: Any) -> tuple[WorkspaceService, str, str]:
    service = make_service(tmp_path, provider, **kw)
    await service.store.migrate()
    project, _ = await service.create_project("p")
    ws = await service.create(project, {"sandbox": SANDBOX})
    return service, project, ws.id


async def test_connect_opens_once(tmp_path: Path, provider: ProcessMemoryProvider) -> None:
    service, project, ws = await _setup(tmp_path, provider, validate_open=False)
    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(service.connect, project, ws)
    assert provider.opened == 1
    await service.store.aclose()


async def test_restart_resumes_the_same_box(
    tmp_path: Path, provider: ProcessMemoryProvider
) -> None:
    service, project, ws = await _setup(tmp_path, provider, validate_open=False)
    await service.connect(project, ws)
    await service._live[ws].workspace.fs.write_file("/unsaved.txt", b"live only")
    await service.aclose()  # the process goes away; the lease and its ref stay
    await service.store.aclose()
    again = make_service(tmp_path, provider, validate_open=False)
    await again.connect(project, ws)
    assert provider.opened == 1  # resolved, not opened again
    assert await again._live[ws].workspace.fs.read_file("/unsaved.txt") == b"live only"
    await again.store.aclose()


async def test_other_holder_waits_for_expiry(
    tmp_path: Path, provider: ProcessMemoryProvider
) -> None:
    service, project, ws = await _setup(tmp_path, provider, validate_open=False, lease_ttl_s=0.3)
    await service.connect(project, ws)
    await service.aclose()
    other = make_service(tmp_path, provider, validate_open=False, holder="other", lease_ttl_s=0.3)
    with pytest.raises(ServiceError) as err:
        await other.connect(project, ws)
    assert err.value.code == "busy"
    with anyio.fail_after(20):
        while True:
            await anyio.sleep(0.1)
            try:
                await other.connect(project, ws)
                break
            except ServiceError as exc:
                if exc.code != "busy":
                    raise
    assert provider.opened == 1
    await service.store.aclose()
    await other.store.aclose()


async def test_idle_stop_takes_a_version(tmp_path: Path, provider: ProcessMemoryProvider) -> None:
    service, project, ws = await _setup(tmp_path, provider, validate_open=False, idle_stop_s=0.0)
    await service.connect(project, ws)
    await service._live[ws].workspace.fs.write_file("/f", b"kept")
    assert await service.stop_idle() == [ws]
    assert not service.is_live(ws)
    assert await service.read_file(project, ws, "/f") == b"kept"
    assert await service.store.get_lease(ws) is None
    await service.store.aclose()


async def test_stop_records_handles_and_reopen_restores(
    tmp_path: Path, provider: ProcessMemoryProvider
) -> None:
    from corral.provider import ProcessRequest

    service, project, ws = await _setup(tmp_path, provider, validate_open=False)
    h = await service.start_process(project, ws, ProcessRequest(command="sleep"), "exec")
    await service._live[ws].workspace.fs.write_file("/f", b"1")
    await service.stop(project, ws)
    info = await service.handle_info(project, ws, h.id)
    assert info.info["state"] == "killed"
    assert not service.is_live(ws)
    await service.connect(project, ws)
    assert provider.opened == 2
    assert await service._live[ws].workspace.fs.read_file("/f") == b"1"
    await service.store.aclose()


async def test_archived_cannot_materialize(tmp_path: Path, provider: ProcessMemoryProvider) -> None:
    service, project, ws = await _setup(tmp_path, provider, validate_open=False)
    await service.archive(project, ws)
    with pytest.raises(ServiceError) as err:
        await service.connect(project, ws)
    assert err.value.code == "conflict"
    await service.store.aclose()


async def test_validate_open_uses_the_providers_checks(tmp_path: Path) -> None:
    from corral_local_bash import LocalBashProvider

    service = make_service(tmp_path, LocalBashProvider(tmpdir_root=str(tmp_path / "boxes")))
    await service.store.migrate()
    project, _ = await service.create_project("p")
    bad = {"provider": "local-bash", "capabilities": ["fs"], "options": {"no_such_option": 1}}
    with pytest.raises(ServiceError) as err:
        await service.create(project, {"sandbox": bad})
    assert err.value.code == "invalid_argument"
    with pytest.raises(ServiceError):
        await service.create(project, {"sandbox": {"provider": "local-bash", "image": "debian"}})
    ok = await service.create(
        project, {"sandbox": {"provider": "local-bash", "capabilities": ["fs"]}}
    )
    assert ok.sandbox.provider == "local-bash"
    await service.store.aclose()


async def test_half_restored_box_is_discarded(
    tmp_path: Path, provider: ProcessMemoryProvider
) -> None:
    from corral import ref_to_json
    from corral.provider import OperationError, ProviderConfig, SessionRef

    service, project, ws = await _setup(tmp_path, provider, validate_open=False)
    await service.connect(project, ws)
    await service._live[ws].workspace.fs.write_file("/f", b"saved")
    await service.stop(project, ws)
    # A crash mid-restore: a box recorded on the lease but never marked ready.
    await service.store.acquire_lease(ws, service.holder, 30)
    half = await provider.inner.open(
        ProviderConfig("in-memory"), SessionRef("half"), frozenset({"fs"})
    )
    await service._record_ref(ws, ref_to_json(half.ref), ready=False)
    again = make_service(tmp_path, provider, validate_open=False)
    await again.connect(project, ws)
    live = again._live[ws].workspace
    assert live.id != half.workspace.id
    assert await live.fs.read_file("/f") == b"saved"
    with pytest.raises(OperationError):
        await half.workspace.fs.read_file("/f")  # closed
    await service.store.aclose()
    await again.store.aclose()


async def test_a_lease_taken_over_is_let_go(
    tmp_path: Path, provider: ProcessMemoryProvider
) -> None:
    """A holder that stalled past its TTL must not keep serving a box another holder took."""
    service, project, ws = await _setup(tmp_path, provider, validate_open=False, lease_ttl_s=0.2)
    await service.connect(project, ws)
    other = make_service(tmp_path, provider, validate_open=False, holder="other", lease_ttl_s=30)
    with anyio.fail_after(20):
        while True:  # no renewal runs here: the lease expires, and "other" takes it
            await anyio.sleep(0.1)
            try:
                await other.connect(project, ws)
                break
            except ServiceError as exc:
                if exc.code != "busy":
                    raise
    with pytest.raises(ServiceError) as err:
        await service.connect(project, ws)
    assert err.value.code == "busy"
    assert not service.is_live(ws)
    assert provider.opened == 1  # "other" resumed the same box
    # The renewal loop's check lets go too.
    await other.renew()
    assert other.is_live(ws)
    await service.store.aclose()
    await other.store.aclose()


async def test_restarted_service_stops_boxes_it_leased(
    tmp_path: Path, provider: ProcessMemoryProvider
) -> None:
    service, project, ws = await _setup(tmp_path, provider, validate_open=False)
    await service.connect(project, ws)
    await service._live[ws].workspace.fs.write_file("/f", b"before restart")
    await service.aclose()
    again = make_service(tmp_path, provider, validate_open=False, idle_stop_s=0.0)
    assert not again.is_live(ws)
    assert await again.stop_idle() == [ws]  # found by its lease, resumed, versioned, stopped
    assert await again.read_file(project, ws, "/f") == b"before restart"
    assert await again.store.get_lease(ws) is None
    # An explicit stop after a restart does the same.
    await again.connect(project, ws)
    await again.aclose()
    third = make_service(tmp_path, provider, validate_open=False)
    assert (await third.stop(project, ws))["version_id"] is not None
    other = make_service(tmp_path, provider, validate_open=False, holder="other")
    await third.connect(project, ws)
    with pytest.raises(ServiceError) as err:
        await other.stop(project, ws)
    assert err.value.code == "busy"
    for s in (service, again, third, other):
        await s.store.aclose()
