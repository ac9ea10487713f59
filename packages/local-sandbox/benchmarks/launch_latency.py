"""Launch latency of ``true``: local-sandbox vs local-bash vs bare bwrap, in one process.

Run: ``uv run python packages/local-sandbox/benchmarks/launch_latency.py [N]``.
Prints median and p95 (ms) of N runs (default 100) of each, interleaved in
rounds so load on a shared machine hits every variant alike.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import anyio

import corral
import corral.provider
from corral_local_bash import LocalBashProvider
from corral_local_sandbox import LocalSandboxProvider


def _stats(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered):6.1f} ms   p95 {p95:6.1f} ms"


async def main(n: int) -> None:
    root = tempfile.mkdtemp(prefix="corral-bench-")
    bwrap = shutil.which("bwrap")
    assert bwrap is not None
    bare = [bwrap, "--unshare-all", "--ro-bind", "/", "/", "--", "/bin/true"]
    try:
        sandbox = await LocalSandboxProvider(tmpdir_root=root).open(
            corral.ProviderConfig("local-sandbox"), corral.SessionRef("bench")
        )
        bash = await LocalBashProvider(tmpdir_root=root).open(
            corral.ProviderConfig("local-bash"), corral.SessionRef("bench")
        )
        shells = {"local-sandbox": sandbox.workspace.shell, "local-bash": bash.workspace.shell}
        times: dict[str, list[float]] = {"local-sandbox": [], "local-bash": [], "bare bwrap": []}
        request = corral.provider.CommandRequest("true")
        for shell in shells.values():
            assert shell is not None
            for _ in range(3):
                assert (await shell.run(request)).exit_code == 0
        for _ in range(n):
            for name, shell in shells.items():
                assert shell is not None
                t = time.perf_counter()
                result = await shell.run(request)
                times[name].append((time.perf_counter() - t) * 1000)
                assert result.exit_code == 0, result
            t = time.perf_counter()
            await anyio.to_thread.run_sync(lambda: subprocess.run(bare, check=True))
            times["bare bwrap"].append((time.perf_counter() - t) * 1000)
        for name, samples in times.items():
            print(f"{name:14} {_stats(samples)}")
        ratio = statistics.median(times["local-sandbox"]) / statistics.median(times["local-bash"])
        print(f"local-sandbox / local-bash median: {ratio:.2f}x")
        await sandbox.workspace.close()
        await bash.workspace.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 100)
