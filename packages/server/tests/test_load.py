"""A bounded load test on loopback: N clients x M workspaces, every kind of call; 0 errors.

Each client creates M workspaces, then for each runs an exec, follows its
stream over SSE to the end, stops the workspace (a version) and reads a
file from it. Prints throughput, p50/p99 per call and the error count
(``pytest -s`` shows it); sizes come from ``CORRAL_LOAD_CLIENTS`` and
``CORRAL_LOAD_WORKSPACES``. Nothing asserts on time.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral_server import AsyncClient
from server_support import SANDBOX, make_service, running

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

CLIENTS = int(os.environ.get("CORRAL_LOAD_CLIENTS", "4"))
WORKSPACES = int(os.environ.get("CORRAL_LOAD_WORKSPACES", "3"))


async def test_load(tmp_path: Path, provider: Any, anyio_backend: str) -> None:
    if anyio_backend != "asyncio":
        pytest.skip("one backend is enough for a load figure (both run every other test)")
    service = make_service(tmp_path, provider, validate_open=False)
    times: dict[str, list[float]] = defaultdict(list)
    errors: list[str] = []

    async def timed(name: str, call: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await call
        except Exception as exc:
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            raise
        finally:
            times[name].append(time.perf_counter() - t0)

    async def client_run(url: str, token: str) -> None:
        async with AsyncClient(url, token) as c:
            for _ in range(WORKSPACES):
                ws = (await timed("create", c.create(SANDBOX)))["id"]
                h = (await timed("exec", c.exec(ws, "count 200")))["id"]
                got = b""

                async def follow(ws: str = ws, h: str = h) -> bytes:
                    out = b""
                    async for event in c.follow(ws, h):
                        out += event.data
                    return out

                got = await timed("follow", follow())
                assert got.count(b"\n") == 200
                live = service._live[ws].workspace
                await live.fs.write_file("/out.txt", got)
                await timed("stop", c.stop(ws))
                assert await timed("read_file", c.read_file(ws, "/out.txt")) == got
                await timed("ls", c.ls(ws))
                await timed("list", c.list_workspaces(limit=10))

    async with running(service) as (url, token):
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(CLIENTS):
                tg.start_soon(client_run, url, token)
        wall = time.perf_counter() - t0
    await service.store.aclose()
    calls = sum(len(v) for v in times.values())
    print(
        f"\nload: {CLIENTS} clients x {WORKSPACES} workspaces: {calls} calls in {wall:.2f} s "
        f"= {calls / wall:.0f} calls/s, errors {len(errors)}"
    )
    for name, samples in sorted(times.items()):
        s = sorted(samples)
        p50, p99 = s[len(s) // 2], s[min(len(s) - 1, int(len(s) * 0.99))]
        print(f"  {name:10s} n={len(s):4d} p50={p50 * 1000:7.2f} ms p99={p99 * 1000:7.2f} ms")
    assert errors == []
