"""Row group 14: ``corral serve`` (issue 18) against the library on the same provider.

A service on SQLite with local-bash boxes, served by hypercorn on loopback
in this process, driven by :class:`corral_server.AsyncClient`:

* reading a 4 KiB file from a stored version over the API vs reading it from
  a live workspace through the library's ``fs`` module (goal <= +2 ms);
* exec create -> first output byte over the API (create, then a long-poll
  read) vs ``ProcessManager.start`` + ``read(wait_s=...)`` in the library.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from _harness import BenchSkip, Ctx, Goal, Row, paired, skip_reason

KIND = "local-bash"
GROUP = "14 server"


def _row(key: str, title: str, subject: str, baseline: str, goal: Goal | None) -> Row:
    return Row(
        id=f"server.{key}",
        group=GROUP,
        title=title,
        provider=KIND,
        subject=subject,
        baseline=baseline,
        goal=goal,
    )


def _provider(root: Path) -> Any:
    from corral_local_bash import LocalBashProvider

    class ProcessLocalBash(LocalBashProvider):
        capabilities = LocalBashProvider.capabilities | {"process"}  # type: ignore[misc]

    return ProcessLocalBash(tmpdir_root=str(root))


async def server_rows(ctx: Ctx) -> list[Row]:
    """Measure the API against the library on local-bash."""
    rows = [
        _row(
            "read4k",
            "read a 4 KiB file from a version (API) vs live fs.read_file",
            "GET files/read",
            "fs.read_file",
            Goal("added_us", 2000),
        ),
        _row(
            "exec_first_byte",
            "exec create -> first output byte",
            "POST exec + read",
            "ProcessManager.start + read",
            Goal("added_us", 5000),
        ),
        _row(
            "follow",
            "stdin -> the byte back over SSE (cat)",
            "POST stdin + SSE event",
            "write_stdin + read",
            None,
        ),
        _row(
            "materialize",
            "materialize (cold: open + seed 1 file) vs provider.open",
            "POST connect",
            "provider.open",
            None,
        ),
        _row("connect", "connect (warm) vs GET /v1/health", "POST connect", "GET health", None),
    ]
    try:
        from corral.provider import ProcessRequest, ProviderConfig, SessionRef
        from corral_server import AsyncClient, LocalBlobStore, WorkspaceService, open_store, serve
    except ImportError as exc:
        for row in rows:
            row.skipped = skip_reason(exc)
        return rows
    base = ctx.tmp / "server"
    base.mkdir(exist_ok=True)
    provider = _provider(base / "boxes")
    service = WorkspaceService(
        open_store(str(base / "state.db")),
        LocalBlobStore(str(base / "blobs")),
        providers=lambda _s: provider,
        validate_open=False,
        idle_stop_s=None,
    )
    reps = 15 if ctx.quick else 41
    sandbox = {"provider": KIND, "capabilities": ["fs", "shell", "process"]}
    data = b"x" * 4096
    try:
        async with anyio.create_task_group() as tg:
            host, port = await tg.start(
                lambda task_status: serve(service, port=0, task_status=task_status)
            )
            _pid, token = await service.create_project(f"bench{time.time_ns()}")
            async with AsyncClient(f"http://{host}:{port}", token) as client:
                ws = (await client.create(sandbox))["id"]
                h = (await client.exec(ws, "printf x > f4k && head -c 4096 f4k > /dev/null"))["id"]
                await client.wait(ws, h)
                live = service._live[ws].workspace
                assert live.fs is not None
                await live.fs.write_file("/f4k", data)
                await client.stop(ws)
                lib = await provider.open(
                    ProviderConfig(KIND),
                    SessionRef("bench-lib"),
                    frozenset(sandbox["capabilities"]),
                )
                try:
                    assert lib.workspace.fs is not None
                    await lib.workspace.fs.write_file("/f4k", data)
                    s_ns, b_ns = [], []
                    for _ in range(reps):
                        t0 = time.perf_counter_ns()
                        got = await client.read_file(ws, "/f4k")
                        s_ns.append(time.perf_counter_ns() - t0)
                        t0 = time.perf_counter_ns()
                        await lib.workspace.fs.read_file("/f4k")
                        b_ns.append(time.perf_counter_ns() - t0)
                        if got != data:
                            raise BenchSkip("the API returned different bytes")
                    paired(rows[0], s_ns, b_ns)
                    pm: Any = lib.workspace.module("process")
                    s_ns, b_ns = [], []
                    for _ in range(max(5, reps // 3)):
                        t0 = time.perf_counter_ns()
                        hid = (await client.exec(ws, "echo hi"))["id"]
                        first, _c, _e = await client.read(ws, hid, wait_s=10)
                        s_ns.append(time.perf_counter_ns() - t0)
                        t0 = time.perf_counter_ns()
                        info = await pm.start(ProcessRequest(command="echo hi"))
                        chunk = await pm.read(info.process_id, wait_s=10)
                        b_ns.append(time.perf_counter_ns() - t0)
                        if not first or not chunk.data:
                            raise BenchSkip("no first byte")
                    paired(rows[1], s_ns, b_ns)
                    await _follow_row(rows[2], client, ws, pm, reps)
                    await _materialize_rows(rows[3], rows[4], client, ws, provider, reps)
                finally:
                    await lib.workspace.close()
                await client.delete(ws)
            tg.cancel_scope.cancel()
    except Exception as exc:
        for row in rows:
            if row.ratio is None:
                row.skipped = skip_reason(exc)
    finally:
        await service.store.aclose()
    for row in rows:
        ctx.log(f"{row.id}: {row.skipped or 'done'}")
    return rows


async def _follow_row(row: Row, client: Any, ws: str, pm: Any, reps: int) -> None:
    from corral.provider import ProcessRequest

    hid = (await client.exec(ws, "cat"))["id"]
    info = await pm.start(ProcessRequest(command="cat"))
    events = client.follow(ws, hid)
    s_ns, b_ns, cursor = [], [], 0
    try:
        for _ in range(max(5, reps // 2)):
            t0 = time.perf_counter_ns()
            await client.write_stdin(ws, hid, b"x")
            event = await events.__anext__()
            s_ns.append(time.perf_counter_ns() - t0)
            if event.data != b"x":
                raise BenchSkip("the event did not carry the byte written")
            t0 = time.perf_counter_ns()
            await pm.write_stdin(info.process_id, b"x")
            chunk = await pm.read(info.process_id, cursor=cursor, wait_s=10)
            b_ns.append(time.perf_counter_ns() - t0)
            cursor = chunk.next_cursor
    finally:
        await client.kill(ws, hid)
        await pm.kill(info.process_id)
        await events.aclose()
    paired(row, s_ns, b_ns)


async def _materialize_rows(
    cold: Row, warm: Row, client: Any, ws: str, provider: Any, reps: int
) -> None:
    from corral.provider import ProviderConfig, SessionRef

    s_ns, b_ns = [], []
    for i in range(max(5, reps // 4)):
        await client.stop(ws)
        t0 = time.perf_counter_ns()
        await client.connect(ws)
        s_ns.append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns()
        opened = await provider.open(
            ProviderConfig(KIND),
            SessionRef(f"bench-open-{i}"),
            frozenset({"fs", "shell", "process"}),
        )
        b_ns.append(time.perf_counter_ns() - t0)
        await opened.workspace.close()
    paired(cold, s_ns, b_ns)
    s_ns, b_ns = [], []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        await client.connect(ws)
        s_ns.append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns()
        await client._http.get("/v1/health")
        b_ns.append(time.perf_counter_ns() - t0)
    paired(warm, s_ns, b_ns)
