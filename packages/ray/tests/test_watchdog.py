"""An agent killed hard (SIGKILL, no cleanup) still leaves no commands running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from corral_ray import _watchdog
from corral_ray.testing import processes_matching

# A stand-in agent: starts the watchdog as the real one does, then a command in
# its own session (as the POSIX shells run them), then waits to be killed.
_AGENT = """
import subprocess, sys, os, time
subprocess.Popen([sys.executable, "-I", os.environ["WATCHDOG"], str(os.getpid())],
                 stdin=subprocess.PIPE, start_new_session=True)
m = os.environ["MARK"]
subprocess.Popen(["sh", "-c", f"sleep {m}1 & sleep {m}2"], start_new_session=True)
print("ready", flush=True)
time.sleep(60)
"""


MARK = "31.41592"


def test_sigkilled_agent_leaves_no_commands() -> None:
    env = {**os.environ, "MARK": MARK, "WATCHDOG": _watchdog.__file__}
    agent = subprocess.Popen(
        [sys.executable, "-c", _AGENT], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert agent.stdout is not None
        assert agent.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while len(processes_matching(f"sleep {MARK}")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(processes_matching(f"sleep {MARK}")) >= 2
        # The watchdog is up and has sampled them (it samples every 0.2 s).
        while not processes_matching(_watchdog.__file__) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait()
        deadline = time.monotonic() + 10
        while processes_matching(f"sleep {MARK}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_matching(f"sleep {MARK}") == []
    finally:
        agent.kill()
        agent.wait()
        if agent.stdout is not None:
            agent.stdout.close()
        for pid in processes_matching(f"sleep {MARK}"):
            os.kill(pid, signal.SIGKILL)
