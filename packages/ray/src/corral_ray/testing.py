"""A real multi-node Ray cluster on one machine, for tests and benchmarks.

Each node is a separate ``ray start`` (its own raylet and object store, in
its own process group) with one custom resource naming it; the head and
every worker are started by :meth:`LocalCluster.start_node` and torn down by
process group in :meth:`LocalCluster.stop` -- never ``ray stop``, which
would stop every Ray cluster on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

import attrs

__all__ = ["RAY_TEST_ENV", "LocalCluster", "processes_matching"]

RAY_TEST_ENV: Final = {
    # Node death is noticed within a few seconds instead of half a minute.
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
    "RAY_USAGE_STATS_ENABLED": "0",
    # A loopback-only cluster: no token file written to the home directory.
    "RAY_AUTH_MODE": "disabled",
    # Under ``uv run`` Ray would otherwise ship the working directory to every
    # worker and start them through ``uv run`` (slow, and code from a copy).
    # Read when ray is first imported: set it before that.
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
}
"""Environment every node and driver of a local test cluster runs with."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _group_pids(group: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry.name)) == group:
                    pids.append(int(entry.name))
    return pids


def processes_matching(marker: str) -> list[int]:
    """Pids on this machine (every node of a local cluster) whose command line has ``marker``."""
    me = os.getpid()
    return [
        int(e.name)
        for e in Path("/proc").iterdir()
        if e.name.isdigit() and int(e.name) != me and marker in _cmdline(int(e.name))
    ]


@attrs.define
class LocalCluster:
    """A Ray cluster of separate node processes on this machine.

    Attributes:
        address: The GCS address drivers attach to (``127.0.0.1:PORT``).
        base: A private directory: Ray's session files and workspaces.
        groups: The process group of each node's daemons, by resource name.
    """

    address: str
    base: Path
    groups: dict[str, int] = attrs.field(factory=dict)

    @classmethod
    def create(cls) -> LocalCluster:
        """A cluster description with a free port and a fresh short directory (no node yet)."""
        # Short: Ray's unix socket paths must stay under 108 bytes.
        base = Path(tempfile.mkdtemp(prefix="cr-", dir="/tmp"))
        (base / "ws").mkdir()
        return cls(address=f"127.0.0.1:{_free_port()}", base=base)

    @property
    def root(self) -> Path:
        """A directory for workspaces (the inner providers' ``tmpdir_root``)."""
        return self.base / "ws"

    def env(self) -> dict[str, str]:
        """The environment for ``ray start`` and for driver processes."""
        return {**os.environ, **RAY_TEST_ENV, "TMPDIR": str(self.base)}

    def start_node(self, resource: str, *, head: bool = False, timeout: float = 120) -> None:
        """Start one node with one CPU and the custom resource ``resource``.

        A busy machine can make a raylet miss Ray's fixed 30 s registration
        window; a failed start is cleaned up and tried once more.

        Raises:
            RuntimeError: ``ray start`` failed twice (its output's tail is in the message).
        """
        try:
            self._start_node(resource, head=head, timeout=timeout)
        except RuntimeError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.groups.pop(resource), signal.SIGKILL)
            self._start_node(resource, head=head, timeout=timeout)

    def _start_node(self, resource: str, *, head: bool, timeout: float) -> None:
        ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
        args = [
            ray_bin,
            "start",
            "--num-cpus=1",
            "--node-ip-address=127.0.0.1",
            f"--resources={json.dumps({resource: 1})}",
            "--object-store-memory=80000000",
            "--disable-usage-stats",
        ]
        if head:
            port = self.address.rsplit(":", 1)[1]
            args += ["--head", f"--port={port}", "--include-dashboard=false"]
            args += [f"--temp-dir={self.base / 'rt'}"]
        else:
            args += [f"--address={self.address}"]
        proc = subprocess.Popen(
            args,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.groups[resource] = proc.pid
        out, _ = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start failed: {out.decode(errors='replace')[-1500:]}")

    def kill_node(self, resource: str) -> None:
        """SIGKILL a node's raylet, as a lost machine looks to the cluster."""
        for pid in _group_pids(self.groups[resource]):
            if "raylet" in _cmdline(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """Kill every node's process group (workers, then the head) and remove the directory."""
        for resource in sorted(self.groups, key=lambda r: r == "head"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.groups[resource], signal.SIGKILL)
        shutil.rmtree(self.base, ignore_errors=True)
