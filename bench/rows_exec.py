"""Row groups 2 and 3: command round trip and open latency per provider."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio

import corral

from _harness import BenchSkip, Ctx, Goal, Row, paired, run_pair, skip_reason
from _providers import (
    DOCKER_IMAGE,
    PROVIDERS,
    capabilities_for,
    ok,
    precheck,
    provider_options,
    session,
)

BWRAP_TRUE = [
    "bwrap",
    "--new-session",
    "--die-with-parent",
    "--unshare-all",
    "--ro-bind",
    "/",
    "/",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "true",
]
RUN_ARGS = {"command": "true"}


def _run_row(kind: str, key: str, baseline: str, goal: Goal | None = None) -> Row:
    return Row(
        id=f"run.{key}.{kind}",
        group="2 run",
        title="run `true`",
        provider=kind,
        subject="workspace_run",
        baseline=baseline,
        goal=goal,
    )


def _tool_run(ses: corral.WorkspaceSession) -> Callable[[], Awaitable[corral.ToolResult]]:
    async def call() -> corral.ToolResult:
        return await ses.call("workspace_run", RUN_ARGS)

    return call


def _subprocess_true() -> None:
    subprocess.run(["true"], check=True)


def _bwrap_true() -> None:
    subprocess.run(BWRAP_TRUE, check=True, capture_output=True)


@asynccontextmanager
async def _docker_container() -> AsyncIterator[str]:
    """A container of the same image to ``docker exec`` into, removed afterwards."""
    argv = ["docker", "run", "-d", "--rm", "--network", "none", DOCKER_IMAGE, "sleep", "3600"]
    proc = await anyio.run_process(argv, check=False)
    if proc.returncode != 0:
        raise BenchSkip(f"docker run failed: {proc.stderr.decode(errors='replace').strip()[:120]}")
    cid = proc.stdout.decode().strip()
    try:
        yield cid
    finally:
        await anyio.run_process(["docker", "rm", "-f", cid], check=False)


async def _checked(ses: corral.WorkspaceSession) -> Callable[[], Awaitable[corral.ToolResult]]:
    call = _tool_run(ses)
    result = ok(await call())
    if result.data is None or result.data.get("exit_code") != 0:
        raise BenchSkip(f"`true` did not exit 0: {result.content[:120]}")
    return call


async def run_rows(ctx: Ctx) -> list[Row]:
    """Group 2: ``workspace_run`` of ``true`` against bare process launches."""
    tmp = ctx.tmp / "run"
    bash = _run_row("local-bash", "subprocess", "subprocess.run", Goal("ratio", 1.3))
    sb_bash = _run_row("local-sandbox", "bash", "local-bash workspace_run")
    sb_bwrap = _run_row("local-sandbox", "bwrap", "bare bwrap --unshare-all")
    dock = _run_row("docker", "exec", "docker exec (CLI)")
    rows = [bash, sb_bash, sb_bwrap, dock]
    async with AsyncExitStack() as stack:
        bash_call = None
        try:
            bash_ses = await stack.enter_async_context(session("local-bash", tmp, ("shell",)))
            bash_call = await _checked(bash_ses)
            await run_pair(ctx, bash, bash_call, _subprocess_true, slow=True)
        except BenchSkip as exc:
            bash.skipped = skip_reason(exc)
        try:
            async with session("local-sandbox", tmp, ("shell",)) as ses:
                call = await _checked(ses)
                if bash_call is None:
                    sb_bash.skipped = "local-bash is unavailable"
                else:
                    await run_pair(ctx, sb_bash, call, bash_call, slow=True)
                await run_pair(ctx, sb_bwrap, call, _bwrap_true, slow=True)
        except BenchSkip as exc:
            for row in (sb_bash, sb_bwrap):
                row.skipped = row.skipped or skip_reason(exc)
    try:
        async with session("docker", tmp, ("shell",)) as ses, _docker_container() as cid:
            call = await _checked(ses)
            argv = ["docker", "exec", cid, "true"]

            def docker_exec() -> None:
                subprocess.run(argv, check=True, capture_output=True)

            await run_pair(ctx, dock, call, docker_exec, slow=True)
    except BenchSkip as exc:
        dock.skipped = skip_reason(exc)
    return rows


def _mkdtemp_rmdir(root: str) -> None:
    os.rmdir(tempfile.mkdtemp(dir=root))


def _docker_run_true() -> None:
    subprocess.run(["docker", "run", "--rm", "--network", "none", DOCKER_IMAGE, "true"], check=True)


async def _time_open(kind: str, tmp_root: Path) -> float:
    """Nanoseconds of one eager open; the close after it is not timed."""
    cm = corral.open_workspace(
        kind,
        capabilities_for(kind, ("fs", "shell")),
        provider_options=provider_options(kind, tmp_root),
        open_strategy="eager",
    )
    t0 = time.perf_counter_ns()
    await cm.__aenter__()
    elapsed = time.perf_counter_ns() - t0
    await cm.__aexit__(None, None, None)
    return elapsed


async def open_rows(ctx: Ctx) -> list[Row]:
    """Group 3: eager open of a session per provider against the floor of what it creates."""
    rows: list[Row] = []
    root = ctx.tmp / "open"
    root.mkdir(parents=True, exist_ok=True)
    for kind in PROVIDERS:
        docker = kind == "docker"
        row = Row(
            id=f"open.{kind}",
            group="3 open",
            title="open a workspace (eager)",
            provider=kind,
            subject="open_workspace",
            baseline="docker run --rm IMAGE true" if docker else "mkdtemp + rmdir",
        )
        rows.append(row)
        reason = precheck(kind)
        if reason is not None:
            row.skipped = reason
            continue
        if docker:
            baseline: Callable[[], None] = _docker_run_true
        else:

            def baseline() -> None:
                _mkdtemp_rmdir(str(root))

        reps = (3 if ctx.quick else 9) if docker else (7 if ctx.quick else 25)
        s_ns: list[float] = []
        b_ns: list[float] = []
        try:
            await _time_open(kind, root)  # warm-up: imports, plugin load, image cache
            baseline()
            for i in range(reps):
                if i % 2:
                    t0 = time.perf_counter_ns()
                    baseline()
                    b_ns.append(time.perf_counter_ns() - t0)
                    s_ns.append(await _time_open(kind, root))
                else:
                    s_ns.append(await _time_open(kind, root))
                    t0 = time.perf_counter_ns()
                    baseline()
                    b_ns.append(time.perf_counter_ns() - t0)
        except (corral.WorkspaceError, OSError, subprocess.CalledProcessError) as exc:
            row.skipped = f"{kind} failed to open: {skip_reason(exc)}"
            continue
        paired(row, s_ns, b_ns)
        ctx.log(f"{row.id}: {s_ns[len(s_ns) // 2] / 1e6:.2f} ms")
    return rows
