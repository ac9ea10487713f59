"""Measure corral-docker's open and run latency against the docker CLI, in one run.

Usage: uv run python packages/docker/scripts/bench.py [--image IMAGE] [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time

import anyio

import corral
import corral.provider
from corral_docker import DockerProvider


def _cli(image: str, rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {
        "docker run --rm IMAGE true (CLI)": [],
        "docker exec true (CLI)": [],
    }
    for _ in range(rounds):
        t = time.perf_counter()
        subprocess.run(["docker", "run", "--rm", "--network", "none", image, "true"], check=True)
        out["docker run --rm IMAGE true (CLI)"].append(time.perf_counter() - t)
    cid = subprocess.run(
        ["docker", "run", "-d", "--network", "none", image, "sleep", "600"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        for _ in range(rounds):
            t = time.perf_counter()
            subprocess.run(["docker", "exec", cid, "true"], check=True)
            out["docker exec true (CLI)"].append(time.perf_counter() - t)
    finally:
        subprocess.run(["docker", "rm", "-f", cid], check=True, capture_output=True)
    return out


async def _run_once(shell: corral.provider.Shell) -> float:
    t = time.perf_counter()
    result = await shell.run(corral.provider.CommandRequest("true"))
    assert result.exit_code == 0
    return time.perf_counter() - t


async def _corral(image: str, rounds: int, root: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for pool in (0, 2):
        provider = DockerProvider(image=image, tmpdir_root=root, pool_size=pool)
        await provider.engine.ping()  # SDK import and client creation are not per-open costs
        if pool:
            await provider.warm()
        opens, firsts, steady = [], [], []
        for _ in range(rounds):
            if pool:
                await provider.warm()
            t = time.perf_counter()
            opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("b"))
            opens.append(time.perf_counter() - t)
            shell = opened.workspace.shell
            assert shell is not None
            firsts.append(await _run_once(shell))
            for _ in range(5):
                steady.append(await _run_once(shell))
            await opened.workspace.close()
        label = f"pool_size={pool}"
        out[f"corral open ({label})"] = opens
        out[f"corral first run ({label})"] = firsts
        out[f"corral steady run ({label})"] = steady
        await provider.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", default="corral-test:latest")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results = _cli(args.image, args.rounds)
    with tempfile.TemporaryDirectory() as root:
        results.update(anyio.run(_corral, args.image, args.rounds, root))
    print(f"{'operation':45} {'p50 ms':>8} {'min ms':>8} {'n':>3}")
    for name, values in results.items():
        med, low = statistics.median(values) * 1000, min(values) * 1000
        print(f"{name:45} {med:8.1f} {low:8.1f} {len(values):3d}")


if __name__ == "__main__":
    main()
