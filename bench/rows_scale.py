"""Row group 6: many sessions in one process: memory per workspace and calls per second."""

from __future__ import annotations

import gc
import time
import tracemalloc
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

import corral

from _harness import BenchSkip, Ctx, Row, paired, skip_reason
from _providers import ok, session

DATA = "x" * 4095 + "\n"
ARGS = {"path": "/f.txt"}


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise BenchSkip("no /proc/self/status (RSS is read on Linux only)")


async def _open_many(
    stack: AsyncExitStack, kind: str, ctx: Ctx, n: int
) -> list[corral.WorkspaceSession]:
    caps = ("fs", "shell") if kind != "in-memory" else ("fs",)
    out = []
    for _ in range(n):
        ses = await stack.enter_async_context(session(kind, ctx.tmp / "scale", caps))
        ok(await ses.call("workspace_write_file", {"path": "/f.txt", "content": DATA}))
        out.append(ses)
    return out


async def _per_call_ns(sessions: list[corral.WorkspaceSession], total: int) -> float:
    per_task = max(1, total // len(sessions))

    async def worker(ses: corral.WorkspaceSession) -> None:
        for _ in range(per_task):
            await ses.call("workspace_read_file", ARGS)

    t0 = time.perf_counter_ns()
    async with anyio.create_task_group() as tg:
        for ses in sessions:
            tg.start_soon(worker, ses)
    return (time.perf_counter_ns() - t0) / (per_task * len(sessions))


async def _provider(ctx: Ctx, kind: str) -> list[Row]:
    n = 200 if ctx.quick else 1000
    levels = (1, 10, 100) if ctx.quick else (1, 10, 100, 1000)
    mem = Row(
        id=f"scale.memory.{kind}",
        group="6 scale",
        title=f"memory per open workspace ({n} open)",
        provider=kind,
        subject="open sessions",
        baseline="-",
    )
    rate = [
        Row(
            id=f"scale.calls{c}.{kind}",
            group="6 scale",
            title=f"read_file 4 KiB, {c} concurrent",
            provider=kind,
            subject=f"{c} session{'s' if c > 1 else ''}",
            baseline="1 session",
        )
        for c in levels
    ]
    try:
        async with AsyncExitStack() as stack:  # warm-up: plugins, imports, thread pool
            await _open_many(stack, kind, ctx, 2)
        gc.collect()
        rss0 = _rss_bytes()
        async with AsyncExitStack() as stack:
            sessions = await _open_many(stack, kind, ctx, n)
            gc.collect()
            rss = (_rss_bytes() - rss0) / n
            total = 500 if ctx.quick else 3000
            reps = 3 if ctx.quick else 7
            samples: dict[int, list[float]] = {c: [] for c in levels}
            await _per_call_ns(sessions[:10], total)  # warm-up
            for _ in range(reps):
                for c in levels:
                    samples[c].append(await _per_call_ns(sessions[:c], max(total, 2 * c)))
            for row, c in zip(rate, levels, strict=True):
                paired(row, samples[c], samples[1])
                assert row.subject_ns is not None
                row.shown = f"{1e9 / row.subject_ns.median:,.0f} calls/s"
                ctx.log(f"{row.id}: {row.shown}")
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        async with AsyncExitStack() as stack:
            await _open_many(stack, kind, ctx, n)
            gc.collect()
            traced = (tracemalloc.get_traced_memory()[0] - base) / n
        tracemalloc.stop()
        mem.shown = f"{traced / 1024:.1f} KiB traced, {rss / 1024:.1f} KiB RSS"
        mem.extra = {"sessions": n, "traced_bytes": traced, "rss_bytes": rss}
        mem.subject_ns = None
        ctx.log(f"{mem.id}: {mem.shown}")
    except BenchSkip as exc:
        for row in (mem, *rate):
            row.skipped = skip_reason(exc)
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    return [mem, *rate]


async def scale_rows(ctx: Ctx) -> list[Row]:
    """Group 6 on in-memory and local-bash."""
    return [row for kind in ("in-memory", "local-bash") for row in await _provider(ctx, kind)]
