"""The HTTP API end to end on a real loopback server: workspaces, files from versions, handles."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from corral_server import ApiError, AsyncClient, WorkspaceService
from server_support import SANDBOX, raw_events

pytestmark = pytest.mark.anyio


async def test_create_get_list_update(api: tuple[WorkspaceService, AsyncClient]) -> None:
    _service, client = api
    ws = await client.create(SANDBOX, metadata={"a": 1}, tags=["x", "y"])
    assert ws["id"].startswith("ws-")
    assert len(ws["id"]) == 35
    assert ws["state"] == "active"
    assert ws["live"] is False
    assert ws["sandbox"]["mount_path"] == "/workspace"
    assert (await client.get(ws["id"]))["metadata"] == {"a": 1}
    updated = await client.update(ws["id"], metadata={"b": 2}, tags=["z"])
    assert updated["metadata"] == {"b": 2}
    assert updated["tags"] == ["z"]
    assert [w["id"] for w in (await client.list_workspaces(tag="z"))["workspaces"]] == [ws["id"]]
    assert (await client.list_workspaces(tag="x"))["workspaces"] == []


async def test_files_round_trip_through_versions(api: tuple[WorkspaceService, AsyncClient]) -> None:
    service, client = api
    ws = await client.create(SANDBOX)
    await client.connect(ws["id"])
    live = service._live[ws["id"]].workspace
    assert live.fs is not None
    await live.fs.mkdir("/src")
    await live.fs.write_file("/src/app.py", b"print(1)\n")
    first = (await client.get(ws["id"]))["current_version_id"]
    stopped = await client.stop(ws["id"])
    assert stopped["version_id"] != first
    assert await client.read_file(ws["id"], "src/app.py") == b"print(1)\n"
    assert [e["name"] for e in await client.ls(ws["id"], "/src")] == ["app.py"]
    st = await client.stat(ws["id"], "/src/app.py")
    assert st["type"] == "file"
    assert st["size"] == 9
    with pytest.raises(ApiError) as err:
        await client.read_file(ws["id"], "/src/app.py", version_id=first)
    assert err.value.code == "not_found"


async def test_files_are_read_without_opening_the_provider(
    api: tuple[WorkspaceService, AsyncClient], provider: Any
) -> None:
    service, client = api
    ws = await client.create(SANDBOX)
    await client.connect(ws["id"])
    fs = service._live[ws["id"]].workspace.fs
    await fs.write_file("/a.txt", b"A" * 4096)
    version = (await client.stop(ws["id"]))["version_id"]
    opened = provider.opened
    provider.openable = False  # any open or resolve now fails the test
    assert await client.read_file(ws["id"], "/a.txt") == b"A" * 4096
    assert await client.read_file(ws["id"], "/a.txt", version_id=version) == b"A" * 4096
    assert [e["name"] for e in await client.ls(ws["id"])] == ["a.txt"]
    assert (await client.stat(ws["id"], "a.txt"))["size"] == 4096
    assert provider.opened == opened
    assert not service.is_live(ws["id"])


async def test_exec_handle_read_after_cursor_and_wait(
    api: tuple[WorkspaceService, AsyncClient],
) -> None:
    _service, client = api
    ws = await client.create(SANDBOX)
    h = await client.exec(ws["id"], "count 100")
    assert h["id"].startswith("h-")
    data, cursor, ended = await client.read(ws["id"], h["id"], max_bytes=10)
    assert data == b"0\n1\n2\n3\n4\n"
    assert cursor == 10
    assert not ended
    rest, end, ended = await client.read(ws["id"], h["id"], cursor=cursor, max_bytes=1 << 20)
    assert ended
    assert data + rest == b"".join(f"{i}\n".encode() for i in range(100))
    info = await client.wait(ws["id"], h["id"], timeout_s=5)
    assert info["state"] == "exited"
    assert info["exit_code"] == 0
    assert info["stdout_end"] == end
    err = await client.exec(ws["id"], "fail")
    data, _, _ = await client.read(ws["id"], err["id"], stream="stderr", wait_s=1)
    assert data == b"oops\n"


async def test_stdin_signal_resize_kill(api: tuple[WorkspaceService, AsyncClient]) -> None:
    _service, client = api
    ws = await client.create(SANDBOX)
    h = await client.exec(ws["id"], "cat")
    await client.write_stdin(ws["id"], h["id"], b"hello ")
    info = await client.write_stdin(ws["id"], h["id"], b"world", close=True)
    assert info["state"] == "exited"
    data, _, ended = await client.read(ws["id"], h["id"], max_bytes=100)
    assert data == b"hello world"
    assert ended
    t = await client.pty(ws["id"], command="sleep", cols=100, rows=30)
    assert t["kind"] == "pty"
    assert t["terminal"] == {"cols": 100, "rows": 30}
    resized = await client.resize(ws["id"], t["id"], 120, 40)
    assert resized["terminal"] == {"cols": 120, "rows": 40}
    with pytest.raises(ApiError) as err:
        await client.resize(ws["id"], h["id"], 10, 10)
    assert err.value.code in ("invalid_argument", "conflict")
    killed = await client.kill(ws["id"], t["id"])
    assert killed["state"] == "killed"


async def test_cursor_expired_names_the_earliest(api: tuple[WorkspaceService, AsyncClient]) -> None:
    _service, client = api
    ws = await client.create(SANDBOX)
    h = await client.exec(ws["id"], "count 1000", retained_bytes=1024)
    with pytest.raises(ApiError) as err:
        await client.read(ws["id"], h["id"], cursor=0)
    info = await client.handle(ws["id"], h["id"])
    assert err.value.code == "cursor_expired"
    assert err.value.status == 410
    assert err.value.details["earliest"] == info["stdout_start"] == info["stdout_end"] - 1024


async def test_follow_resumes_from_last_event_id(api: tuple[WorkspaceService, AsyncClient]) -> None:
    _service, client = api
    ws = await client.create(SANDBOX)
    h = await client.exec(ws["id"], "cat")
    got = b""
    await client.write_stdin(ws["id"], h["id"], b"one,")
    # A raw connection that drops after the first event (as a network would).
    lines = await raw_events(client, ws["id"], h["id"], until=lambda t: "event: data" in t)
    cursor = int(next(x for x in lines if x.startswith("id: "))[4:])
    got += base64.b64decode(next(x for x in lines if x.startswith("data: "))[6:])
    await client.write_stdin(ws["id"], h["id"], b"two,")
    await client.write_stdin(ws["id"], h["id"], b"three", close=True)
    kinds = []
    async for event in client.follow(ws["id"], h["id"], cursor=cursor):
        kinds.append(event.kind)
        got += event.data
    assert got == b"one,two,three"
    assert kinds[-1] == "end"


async def test_keepalive_on_idle_stream(tmp_path: Any, provider: Any) -> None:
    from server_support import make_service, running

    service = make_service(tmp_path, provider)
    async with running(service, keepalive_s=0.05) as (url, token):
        async with AsyncClient(url, token) as client:
            ws = await client.create(SANDBOX)
            h = await client.exec(ws["id"], "sleep")
            lines = await raw_events(client, ws["id"], h["id"], until=lambda t: ": keepalive" in t)
        assert "content-type: text/event-stream" in lines
    await service.store.aclose()


async def test_handle_output_survives_stop(
    api: tuple[WorkspaceService, AsyncClient], provider: Any
) -> None:
    service, client = api
    ws = await client.create(SANDBOX)
    h = await client.exec(ws["id"], "count 50")
    running = await client.exec(ws["id"], "sleep")
    await client.stop(ws["id"])
    provider.openable = False  # reading archived output opens nothing
    data, _end, ended = await client.read(ws["id"], h["id"], cursor=5, max_bytes=1 << 20)
    assert data == b"".join(f"{i}\n".encode() for i in range(50))[5:]
    assert ended
    info = await client.handle(ws["id"], running["id"])
    assert info["state"] == "killed"
    assert not service.is_live(ws["id"])
