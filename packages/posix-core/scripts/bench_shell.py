"""Latency of ``SubprocessShell.run("true")`` against a bare ``subprocess.run``.

Usage: ``uv run python packages/posix-core/scripts/bench_shell.py [N]``.

Both are measured in the same process, interleaved one for one (the machine
is shared, so load changes hit both alike), after 20 warm-up runs, on
asyncio and on trio; prints median and p95 in milliseconds.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time

import anyio

from corral.provider import CommandRequest
from corral_posix import SubprocessShell


def _stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[max(0, round(len(ordered) * 0.95) - 1)]


async def _measure(n: int) -> tuple[list[float], list[float]]:
    with tempfile.TemporaryDirectory() as root:
        sh = SubprocessShell(root)
        request = CommandRequest("true")
        # The bare baseline is measured blocking on purpose: it is the reference.
        for _ in range(20):
            await sh.run(request)
            subprocess.run(["true"], check=True)  # noqa: ASYNC221
        bare, shell = [], []
        for _ in range(n):
            t = time.perf_counter()
            subprocess.run(["true"], check=True)  # noqa: ASYNC221
            bare.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            result = await sh.run(request)
            shell.append((time.perf_counter() - t) * 1000)
            assert result.exit_code == 0
        await sh.aclose()
        return bare, shell


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    for backend in ("asyncio", "trio"):
        bare, shell = anyio.run(_measure, n, backend=backend)
        (bare_med, bare_p95), (shell_med, shell_p95) = _stats(bare), _stats(shell)
        print(
            f"{backend:8s} subprocess.run   median {bare_med:6.3f} ms  p95 {bare_p95:6.3f} ms\n"
            f"{backend:8s} SubprocessShell  median {shell_med:6.3f} ms  p95 {shell_p95:6.3f} ms"
            f"  median ratio {shell_med / bare_med:4.2f}x  p95 ratio {shell_p95 / bare_p95:4.2f}x"
        )


if __name__ == "__main__":
    main()
