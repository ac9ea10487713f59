"""Row group 13: the ``code`` module against a Jupyter kernel (jupyter_client + ipykernel).

``1+1`` in a warm context vs the same cell through a started ipykernel's
client; creating (and deleting) a context vs starting a kernel and waiting
until it is idle (then shutting it down); and the resident memory of one
idle context next to an idle kernel's, on each provider with a code module
(docker: in the code image, corral-python:bookworm).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import corral

from _harness import BenchSkip, Ctx, Goal, Row, run_pair, skip_reason
from _providers import precheck

CELL = "1+1"
PROVIDERS = ("local-bash", "local-sandbox", "docker")
# The goals for a warm cell: half a kernel's round trip locally, one
# kernel's on docker (its channel is an attached exec stream through the daemon).
RUN_GOALS = {"local-bash": 0.5, "local-sandbox": 0.5, "docker": 1.0}


def _row(
    key: str, provider: str, title: str, subject: str, baseline: str, goal: float | None
) -> Row:
    return Row(
        id=f"code.{key}.{provider}",
        group="13 code",
        title=title,
        provider=provider,
        subject=subject,
        baseline=baseline,
        goal=None if goal is None else Goal("ratio", goal),
    )


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise BenchSkip("no VmRSS")


class _Kernel:
    """One ipykernel started with the interpreter running the bench (its own venv)."""

    def __init__(self) -> None:
        try:
            from jupyter_client.manager import KernelManager
        except ImportError as exc:  # pragma: no cover - the dev group has it
            raise BenchSkip("jupyter_client is not installed") from exc
        self._cls = KernelManager
        self.manager: Any = None
        self.client: Any = None

    def _launch(self) -> tuple[Any, Any]:
        cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        manager = self._cls(kernel_cmd=cmd)
        manager.start_kernel()
        client = manager.client()
        client.start_channels()
        client.wait_for_ready(timeout=60)
        return manager, client

    @staticmethod
    def _shutdown(manager: Any, client: Any) -> None:
        client.stop_channels()
        manager.shutdown_kernel(now=True)

    def start(self) -> None:
        """Start the warm kernel the cell row runs in."""
        self.manager, self.client = self._launch()

    def stop(self) -> None:
        """Shut the warm kernel down."""
        if self.manager is not None:
            self._shutdown(self.manager, self.client)
        self.manager = self.client = None

    def run(self) -> None:
        """``1+1`` through the warm kernel, waiting for its reply."""
        reply = self.client.execute_interactive(CELL, timeout=30, output_hook=lambda _msg: None)
        if reply["content"]["status"] != "ok":
            raise RuntimeError("the kernel failed 1+1")

    def start_and_stop(self) -> None:
        """A separate kernel from launch to idle, then shut down (the warm one is untouched)."""
        self._shutdown(*self._launch())

    def pid(self) -> int:
        return int(self.manager.provisioner.process.pid)


def _module(code: Any, provider: str) -> Any:
    if code is None:
        raise BenchSkip(f"{provider} has no code module")
    return code


def _options(provider: str, ctx: Ctx) -> dict[str, Any]:
    """Docker runs the contexts in the code image (python3 in the container)."""
    if provider != "docker":
        return {}
    from corral_docker._options import code_image

    why = precheck("docker")
    if why is not None:
        raise BenchSkip(why)
    return {"image": code_image(), "pull": False, "tmpdir_root": str(ctx.tmp)}


def _check(first: Any) -> None:
    if first.result_json != "2":
        raise RuntimeError(f"1+1 gave {first.result_json!r}")


async def _provider_rows(ctx: Ctx, provider: str, kernel: _Kernel) -> list[Row]:
    run = _row(
        "run",
        provider,
        'code "1+1" warm',
        "run_in_context",
        "ipykernel execute",
        RUN_GOALS[provider],
    )
    create = _row(
        "create", provider, "code context start", "create+delete", "kernel start-to-idle", 1.0
    )
    memory = _row("memory", provider, "code idle context RSS", "one context", "one ipykernel", None)
    rows = [run, create, memory]
    try:
        async with corral.open_workspace(
            provider, {"code": {"is_stateful": True}}, provider_options=_options(provider, ctx)
        ) as ws:
            code = _module((await ws.workspace()).code, provider)
            warm = await code.create_context("python")
            _check(await code.run_in_context(warm, CELL, timeout_s=10))

            async def cell() -> object:
                return await code.run_in_context(warm, CELL, timeout_s=10)

            async def lifecycle() -> None:
                await code.delete_context(await code.create_context("python"))

            await run_pair(ctx, run, cell, kernel.run)
            await run_pair(ctx, create, lifecycle, kernel.start_and_stop, slow=True)
            probe = await code.run_in_context(
                warm,
                "[l.split()[1] for l in open('/proc/self/status') if l.startswith('VmRSS')][0]",
                timeout_s=10,
            )
            mine = int(json.loads(probe.result_json or "0"))
            theirs = _rss_kib(kernel.pid())
            memory.shown = f"{mine / 1024:.1f} MiB"
            memory.extra = {"context_rss_kib": mine, "kernel_rss_kib": theirs}
            memory.baseline = f"ipykernel {theirs / 1024:.1f} MiB"
            ctx.log(f"{memory.id}: {memory.shown} vs {theirs / 1024:.1f} MiB")
    except Exception as exc:
        for row in rows:
            row.skipped = row.skipped or skip_reason(exc)
    if memory.skipped is None and memory.shown is None:
        memory.skipped = "not measured"
    return rows


async def code_rows(ctx: Ctx) -> list[Row]:
    """Warm cell, context start and idle memory on each POSIX provider vs one ipykernel."""
    rows: list[Row] = []
    try:
        kernel = _Kernel()
        started = time.perf_counter()
        kernel.start()
        ctx.log(f"ipykernel ready in {(time.perf_counter() - started) * 1000:.0f} ms")
    except Exception as exc:
        reason = skip_reason(exc)
        for provider in PROVIDERS:
            rows += _skipped(provider, reason)
        return rows
    try:
        for provider in PROVIDERS:
            rows += await _provider_rows(ctx, provider, kernel)
    finally:
        kernel.stop()
    return rows


def _skipped(provider: str, reason: str) -> list[Row]:
    made: list[Callable[[], Row]] = [
        lambda: _row(
            "run",
            provider,
            'code "1+1" warm',
            "run_in_context",
            "ipykernel execute",
            RUN_GOALS[provider],
        ),
        lambda: _row(
            "create", provider, "code context start", "create+delete", "kernel start-to-idle", 1.0
        ),
        lambda: _row(
            "memory", provider, "code idle context RSS", "one context", "one ipykernel", None
        ),
    ]
    out = [make() for make in made]
    for row in out:
        row.skipped = reason
    return out
