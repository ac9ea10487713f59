"""Row group 14: ``corral serve`` (issue 18) against the library on the same provider.

A service on SQLite, served by hypercorn on loopback in this process, driven
by :class:`corral_server.AsyncClient`. On local-bash:

* reading a 4 KiB file from a stored version over the API vs reading it from
  a live workspace through the library's ``fs`` module (goal <= +2 ms);
* exec create -> first output byte over the API (create, then a long-poll
  read) vs ``ProcessManager.start`` + ``read(wait_s=...)`` in the library;
* stdin -> the byte back over server-sent events vs ``write_stdin`` + ``read``.

Per provider (local-bash, local-sandbox, docker on ``corral-test:latest``),
for information: materialize (cold: ``POST connect`` of a stopped workspace
whose version holds one 4 KiB file, so it opens a box and seeds the file) vs
``provider.open`` of the same provider, and connect (warm: the box is live)
vs ``GET /v1/health``. A provider that cannot run here is a skip with the
reason; every workspace and box the rows create is deleted.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc

from _harness import BenchSkip, Ctx, Goal, Row, paired, skip_reason
from _providers import precheck, provider_options

KIND = "local-bash"
KINDS: Final = ("local-bash", "local-sandbox", "docker")
"""Providers the materialize and connect rows run on."""
GROUP = "14 server"
_CLEANUP_S: Final = 120.0
"""Bound on deleting a workspace at the end (a docker box's removal), so a
wedged service cannot hang the bench."""


def _row(
    key: str, title: str, subject: str, baseline: str, goal: Goal | None, provider: str = KIND
) -> Row:
    return Row(
        id=f"server.{key}",
        group=GROUP,
        title=title,
        provider=provider,
        subject=subject,
        baseline=baseline,
        goal=goal,
    )


def _provider(kind: str, root: Path) -> Any:
    """The provider the service and the library baselines share for ``kind``."""
    options = provider_options(kind, root)
    if kind == "local-bash":
        from corral_local_bash import LocalBashProvider

        return LocalBashProvider(**options)
    if kind == "local-sandbox":
        from corral_local_sandbox import LocalSandboxProvider

        return LocalSandboxProvider(**options)
    from corral_docker import DockerProvider

    return DockerProvider(**options)


async def server_rows(ctx: Ctx) -> list[Row]:
    """Measure the API against the library on local-bash; materialize/connect per provider."""
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
    ]
    per_kind: dict[str, tuple[Row, Row]] = {}
    for kind in KINDS:
        per_kind[kind] = (
            _row(
                f"materialize.{kind}",
                "materialize (cold: open + seed 1 file) vs provider.open",
                "POST connect",
                "provider.open",
                None,
                kind,
            ),
            _row(
                f"connect.{kind}",
                "connect (warm) vs GET /v1/health",
                "POST connect",
                "GET health",
                None,
                kind,
            ),
        )
        rows += per_kind[kind]
    try:
        from corral_server import AsyncClient, LocalBlobStore, WorkspaceService, open_store, serve
    except ImportError as exc:
        for row in rows:
            row.skipped = skip_reason(exc)
        return rows
    base = ctx.tmp / "server"
    base.mkdir(exist_ok=True)
    providers: dict[str, Any] = {}
    service = WorkspaceService(
        open_store(str(base / "state.db")),
        LocalBlobStore(str(base / "blobs")),
        providers=lambda sandbox: providers[sandbox.provider],
        validate_open=False,
        idle_stop_s=None,
    )
    reps = 15 if ctx.quick else 41
    try:
        async with anyio.create_task_group() as tg:
            host, port = await tg.start(
                lambda task_status: serve(service, port=0, task_status=task_status)
            )
            _pid, token = await service.create_project(f"bench{time.time_ns()}")
            async with AsyncClient(f"http://{host}:{port}", token) as client:
                try:
                    providers[KIND] = _provider(KIND, base / "boxes")
                    await _library_rows(rows[:3], client, service, providers[KIND], reps)
                except Exception as exc:
                    for row in rows[:3]:
                        if row.ratio is None:
                            row.skipped = skip_reason(exc)
                for kind, (cold, warm) in per_kind.items():
                    reason = precheck(kind)
                    if reason is not None:
                        cold.skipped = warm.skipped = reason
                        continue
                    try:
                        if kind not in providers:
                            providers[kind] = _provider(kind, base / "boxes")
                        await _materialize_rows(cold, warm, client, kind, providers[kind], reps)
                    except Exception as exc:
                        for row in (cold, warm):
                            if row.ratio is None:
                                row.skipped = skip_reason(exc)
            tg.cancel_scope.cancel()
    except Exception as exc:
        for row in rows:
            if row.ratio is None and row.skipped is None:
                row.skipped = skip_reason(exc)
    finally:
        with anyio.CancelScope(shield=True):
            await service.store.aclose()
            for provider in providers.values():
                aclose = getattr(provider, "aclose", None)
                if aclose is not None:
                    await aclose()
    for row in rows:
        ctx.log(f"{row.id}: {row.skipped or 'done'}")
    return rows


async def _library_rows(
    rows: list[Row], client: Any, service: Any, provider: Any, reps: int
) -> None:
    """read4k, exec_first_byte and follow on one local-bash workspace, deleted at the end."""
    from corral.provider import ProcessRequest, ProviderConfig, SessionRef

    sandbox = {"provider": KIND, "capabilities": ["fs", "shell", "process"]}
    data = b"x" * 4096
    ws = (await client.create(sandbox))["id"]
    try:
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
        finally:
            await lib.workspace.close()
    finally:
        await _delete(client, ws)


async def _delete(client: Any, ws: str) -> None:
    """Delete a workspace (closing its live box), even when the row is being cancelled."""
    with anyio.move_on_after(_CLEANUP_S, shield=True):
        await client.delete(ws)


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
    cold: Row, warm: Row, client: Any, kind: str, provider: Any, reps: int
) -> None:
    """Cold and warm connect of a fresh one-file workspace on ``kind``, deleted at the end.

    The cold subject and its baseline alternate order per repetition (the
    harness's pairing); stopping the box (which takes a version) and closing
    the baseline's box stay outside the timing.
    """
    from corral.provider import ProviderConfig, SessionRef

    caps = sorted({"fs", "shell", "process"} & set(provider.capabilities))
    data = b"x" * 4096
    ws = (await client.create({"provider": kind, "capabilities": caps}))["id"]
    try:
        b64 = base64.b64encode(data).decode("ascii")
        await client.live_fs(ws, "write_file", path="/f4k", data=b64)
        await client.stop(ws)

        async def subject() -> int:
            t0 = time.perf_counter_ns()
            await client.connect(ws)
            return time.perf_counter_ns() - t0

        async def baseline(i: int) -> int:
            t0 = time.perf_counter_ns()
            opened = await provider.open(
                ProviderConfig(kind),
                SessionRef(f"bench-open-{kind}-{i}-{time.time_ns()}"),
                frozenset(caps),
            )
            spent = time.perf_counter_ns() - t0
            await opened.workspace.close()
            return spent

        s_ns: list[float] = []
        b_ns: list[float] = []
        for i in range(max(5, reps // 4)):
            await client.stop(ws)
            if i % 2 == 0:
                s_ns.append(await subject())
                b_ns.append(await baseline(i))
            else:
                b_ns.append(await baseline(i))
                s_ns.append(await subject())
        seeded = await client.live_fs(ws, "read_file", path="/f4k")
        if base64.b64decode(seeded["data"]) != data:
            raise BenchSkip("the materialized box did not hold the seeded file")
        paired(cold, s_ns, b_ns)
        s_ns, b_ns = [], []
        for i in range(reps):
            if i % 2 == 0:
                s_ns.append(await subject())
            t0 = time.perf_counter_ns()
            await client._http.get("/v1/health")
            b_ns.append(time.perf_counter_ns() - t0)
            if i % 2 == 1:
                s_ns.append(await subject())
        paired(warm, s_ns, b_ns)
    finally:
        await _delete(client, ws)
