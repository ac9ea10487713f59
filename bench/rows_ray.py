"""Row group 12: the ray provider on a local three-node cluster the group starts itself.

* per-call overhead of ``workspace_read_file`` and ``workspace_run true``
  through ``ray`` (wrapping local-bash, the workspace on another node's
  agent) against local-bash directly (goal: at most +1 ms at the median);
* open throughput: N workspaces opened concurrently across the three nodes
  (N = 60, 20 with ``--quick``, ``CORRAL_BENCH_RAY_OPEN=1000`` for the
  issue's figure), workspaces/s, and agent memory per workspace per node;
* per-call latency of ``ls`` with 1, 100 and N sessions calling at once;
* clean-up: after the row every workspace is closed (the agents report
  none), and once the cluster is stopped no process of it is left.
"""

from __future__ import annotations

import os
import statistics
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio

import corral

from _harness import BenchSkip, Ctx, Goal, Row, fmt_num, run_pair, skip_reason
from _providers import ok, session

GROUP = "12 ray"


def _row(key: str, title: str, subject: str, baseline: str, goal: Goal | None = None) -> Row:
    return Row(
        id=f"ray.{key}.ray",
        group=GROUP,
        title=title,
        provider="ray",
        subject=subject,
        baseline=baseline,
        goal=goal,
    )


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


async def ray_rows(ctx: Ctx) -> list[Row]:
    """Group 12: ray call overhead against local-bash, open throughput, latency under load."""
    read = _row(
        "read",
        "read_file 4 KiB",
        "ray workspace_read_file",
        "local-bash workspace_read_file",
        Goal("added_us", 1000),
    )
    run = _row(
        "run", "run `true`", "ray workspace_run", "local-bash workspace_run", Goal("added_us", 1000)
    )
    floor = _row(
        "floor",
        "read_file 4 KiB",
        "ray workspace_read_file",
        "bare Ray call to the same agent",
    )
    n = int(os.environ.get("CORRAL_BENCH_RAY_OPEN", "20" if ctx.quick else "60"))
    opens = _row("open", f"open {n} workspaces on 3 nodes", "concurrent opens", "-")
    levels = sorted({1, min(100, n), n})
    load = _row(
        "load",
        "ls with " + " / ".join(map(str, levels)) + " sessions at once",
        "concurrent sessions",
        "1 session",
    )
    rows = [read, floor, run, opens, load]
    try:
        from corral_ray import shutdown_agents
        from corral_ray.testing import RAY_TEST_ENV, LocalCluster
    except ImportError as exc:
        for row in rows:
            row.skipped = f"corral-ray is not installed ({exc.name})"
        return rows
    os.environ.update(RAY_TEST_ENV)  # before ray is first imported
    cluster = LocalCluster.create()
    try:
        for resource in ("head", "w1", "w2"):
            await anyio.to_thread.run_sync(
                lambda r=resource: cluster.start_node(r, head=r == "head")
            )
        await _measure(ctx, cluster, read, floor, run, opens, load, n, levels)
    except (BenchSkip, RuntimeError, OSError, corral.WorkspaceError) as exc:
        for row in rows:
            row.skipped = row.skipped or skip_reason(exc)
    finally:
        import ray

        if ray.is_initialized():
            await anyio.to_thread.run_sync(shutdown_agents)
            ray.shutdown()
        cluster.stop()
        from corral_ray.testing import processes_matching

        left = processes_matching(str(cluster.base))
        deadline = time.monotonic() + 15
        while left and time.monotonic() < deadline:
            await anyio.sleep(0.2)
            left = processes_matching(str(cluster.base))
        opens.extra["leftover_processes"] = len(left)
        if left:
            ctx.log(f"{opens.id}: {len(left)} processes of the cluster outlived it")
    return rows


async def _measure(
    ctx: Ctx,
    cluster: Any,
    read: Row,
    floor: Row,
    run: Row,
    opens: Row,
    load: Row,
    n: int,
    levels: list[int],
) -> None:
    ray_options = {
        "address": cluster.address,
        "inner": "local-bash",
        "inner_options": {"tmpdir_root": str(cluster.root)},
        "placement": {"resource": "w1"},
    }
    caps: dict[str, Any] = {"fs": True, "shell": {"allowed_commands": ["true"]}}
    async with AsyncExitStack() as stack:
        ray_ses = await stack.enter_async_context(
            corral.open_workspace("ray", caps, provider_options=ray_options, open_strategy="eager")
        )
        bash_ses = await stack.enter_async_context(
            session("local-bash", cluster.root, ("fs", "shell"))
        )
        for ses in (ray_ses, bash_ses):
            ok(await ses.call("workspace_write_file", {"path": "f.txt", "content": "x" * 4096}))

        def call(ses: corral.WorkspaceSession, tool: str, args: dict[str, Any]) -> Any:
            async def op() -> corral.ToolResult:
                return ok(await ses.call(tool, args))

            return op

        await run_pair(
            ctx,
            read,
            call(ray_ses, "workspace_read_file", {"path": "f.txt"}),
            call(bash_ses, "workspace_read_file", {"path": "f.txt"}),
            slow=True,
        )
        # Ray's own floor: one actor call to the agent that hosts the workspace.
        import ray

        payload = ray_ses.ref.payload if ray_ses.ref is not None else {}
        agent = await anyio.to_thread.run_sync(
            lambda: ray.get_actor(payload["agent"], namespace="corral")
        )

        async def bare() -> Any:
            return await agent.ping.remote()

        await run_pair(
            ctx, floor, call(ray_ses, "workspace_read_file", {"path": "f.txt"}), bare, slow=True
        )
        await run_pair(
            ctx,
            run,
            call(ray_ses, "workspace_run", {"command": "true"}),
            call(bash_ses, "workspace_run", {"command": "true"}),
            slow=True,
        )
    await _open_throughput(ctx, cluster, opens, load, n, levels)


async def _timed(read_once: Any, o: Any, samples: list[float]) -> None:
    samples.append(await read_once(o))


async def _open_throughput(
    ctx: Ctx, cluster: Any, opens: Row, load: Row, n: int, levels: list[int]
) -> None:
    from corral_ray import RayProvider

    provider = RayProvider(
        address=cluster.address,
        inner_options={"tmpdir_root": str(cluster.root)},
        max_workspaces_per_node=max(256, n),
    )
    limiter = anyio.CapacityLimiter(32)
    opened: list[Any] = []

    async def open_one(i: int) -> None:
        async with limiter:
            o = await provider.open(
                corral.ProviderConfig(kind="ray"),
                corral.SessionRef(f"bench-{i}"),
                frozenset({"fs"}),
            )
            opened.append(o)

    # Start the agents first: their start-up is a one-off cost, not throughput.
    warm = await provider.open(corral.ProviderConfig(kind="ray"), corral.SessionRef("warm"))
    agents: dict[str, int] = {}
    handles: dict[str, Any] = {}
    try:
        import ray

        for node in await anyio.to_thread.run_sync(ray.nodes):
            if node["Alive"]:
                from corral_ray import agent_name

                name = agent_name(provider.options.agent_tag(), node["NodeID"])
                handle = await anyio.to_thread.run_sync(
                    lambda nm=name: ray.get_actor(nm, namespace="corral")
                )
                info = await anyio.to_thread.run_sync(ray.get, handle.ping.remote())
                agents[node["NodeID"]] = int(info[1]["pid"])
                handles[node["NodeID"]] = handle
    except Exception as exc:
        opens.skipped = skip_reason(exc)
    before = {node: _rss(pid) for node, pid in agents.items()}
    started = time.perf_counter()
    try:
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(open_one, i)
        elapsed = time.perf_counter() - started
        per_node: dict[str, int] = {}
        for o in opened:
            per_node[o.ref.payload["node_id"]] = per_node.get(o.ref.payload["node_id"], 0) + 1
        mem = {
            node[:8]: (_rss(agents[node]) - before[node]) / count
            for node, count in per_node.items()
            if node in agents and count
        }
        per_node_kib = ", ".join(f"{fmt_num(v / 1024)}" for v in mem.values())
        opens.shown = (
            f"{fmt_num(n / elapsed)} workspaces/s; nodes {sorted(per_node.values())}; "
            f"agent RSS +[{per_node_kib}] KiB/workspace per node"
        )
        opens.extra.update({"per_s": n / elapsed, "per_node": per_node, "rss_per_ws": mem})
        ctx.log(f"{opens.id}: {opens.shown}")

        async def read_once(o: Any) -> float:
            t = time.perf_counter()
            await o.workspace.fs.ls("/")
            return time.perf_counter() - t

        medians: dict[int, float] = {}
        for level in levels:
            samples: list[float] = []
            for _ in range(20 if level == 1 else 3):
                async with anyio.create_task_group() as tg:
                    for o in opened[:level]:
                        tg.start_soon(_timed, read_once, o, samples)
            medians[level] = statistics.median(samples) * 1000
        load.shown = "p50 " + ", ".join(
            f"{fmt_num(ms)} ms at {level}" for level, ms in medians.items()
        )
        load.extra.update({"p50_ms": medians})
        ctx.log(f"{load.id}: {load.shown}")
    finally:
        with anyio.CancelScope(shield=True):
            for o in [*opened, warm]:
                await o.workspace.close()
            # Every workspace of the row is gone from its agent.
            import ray

            left = 0
            for handle in handles.values():
                info = await anyio.to_thread.run_sync(ray.get, handle.ping.remote())
                left += int(info[1]["workspaces"])
            opens.extra["left_workspaces"] = left
            if left:
                ctx.log(f"{opens.id}: {left} workspaces still hosted after closing them all")
