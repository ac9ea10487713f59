"""Exec and PTY handles over HTTP on local-bash's real ``process`` module."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral_local_bash import LocalBashProvider
from corral_server import ApiError, AsyncClient
from server_support import make_service, raw_events, running

pytestmark = pytest.mark.anyio

SANDBOX = {"provider": "local-bash", "capabilities": ["fs", "shell", "process"]}


class ProcessLocalBash(LocalBashProvider):
    """local-bash declaring the ``process`` module its builder assembles."""

    capabilities = LocalBashProvider.capabilities | {"process"}  # type: ignore[misc]


@pytest.fixture
async def real(tmp_path: Path) -> AsyncIterator[AsyncClient]:
    provider = ProcessLocalBash(tmpdir_root=str(tmp_path / "boxes"))
    service = make_service(tmp_path, provider, validate_open=False)
    async with running(service) as (url, token), AsyncClient(url, token) as client:
        yield client
        for ws in (await client.list_workspaces())["workspaces"]:
            await client.delete(ws["id"])
    await service.store.aclose()


async def test_exec_streams_and_exit_code(real: AsyncClient) -> None:
    ws = (await real.create(SANDBOX))["id"]
    h = (await real.exec(ws, "printf 'a\\nb\\n'; echo err >&2; exit 7"))["id"]
    info = await real.wait(ws, h, timeout_s=30)
    assert info["state"] == "exited"
    assert info["exit_code"] == 7
    out, _, ended = await real.read(ws, h, max_bytes=100)
    err, _, _ = await real.read(ws, h, stream="stderr")
    assert (out, err, ended) == (b"a\nb\n", b"err\n", True)


async def test_follow_real_output_with_resume(real: AsyncClient) -> None:
    ws = (await real.create(SANDBOX))["id"]
    h = (await real.exec(ws, "for i in 1 2 3 4 5; do echo n$i; sleep 0.05; done"))["id"]
    lines = await raw_events(real, ws, h, until=lambda t: "event: data" in t)
    cursor = int(next(x for x in lines if x.startswith("id: "))[4:])
    got = base64.b64decode(next(x for x in lines if x.startswith("data: "))[6:])
    async for event in real.follow(ws, h, cursor=cursor):
        got += event.data
    assert got == b"".join(f"n{i}\n".encode() for i in range(1, 6))


async def test_pty_input_resize_and_stdin(real: AsyncClient) -> None:
    ws = (await real.create(SANDBOX))["id"]
    t = await real.pty(ws, command="cat", cols=90, rows=20)
    assert t["terminal"] == {"cols": 90, "rows": 20}
    await real.write_stdin(ws, t["id"], b"hello\n")
    got, cursor = b"", 0
    with anyio.fail_after(20):
        while b"hello" not in got:
            data, cursor, _ = await real.read(ws, t["id"], cursor=cursor, wait_s=5)
            got += data
    resized = await real.resize(ws, t["id"], 120, 40)
    assert resized["terminal"] == {"cols": 120, "rows": 40}
    killed = await real.kill(ws, t["id"])
    assert killed["state"] == "killed"


async def test_cursor_expired_names_earliest_real(real: AsyncClient) -> None:
    ws = (await real.create(SANDBOX))["id"]
    h = (await real.exec(ws, "head -c 300000 /dev/zero", retained_bytes=65536))["id"]
    info: dict[str, Any] = await real.wait(ws, h, timeout_s=30)
    assert info["stdout_end"] == 300000
    with pytest.raises(ApiError) as err:
        await real.read(ws, h, cursor=0)
    assert err.value.code == "cursor_expired"
    assert err.value.details["earliest"] == info["stdout_start"] > 0
    data, _, _ = await real.read(ws, h, cursor=info["stdout_start"], max_bytes=1 << 20)
    assert len(data) == 300000 - info["stdout_start"]


async def test_stop_then_files_from_version(real: AsyncClient) -> None:
    ws = (await real.create(SANDBOX))["id"]
    h = (await real.exec(ws, "mkdir -p src && printf 'x = 1\\n' > src/app.py"))["id"]
    await real.wait(ws, h, timeout_s=30)
    await real.stop(ws)
    assert await real.read_file(ws, "src/app.py") == b"x = 1\n"
    h = (await real.exec(ws, "cat src/app.py"))["id"]  # materialised again from the version
    await real.wait(ws, h, timeout_s=30)
    out, _, _ = await real.read(ws, h)
    assert out == b"x = 1\n"
