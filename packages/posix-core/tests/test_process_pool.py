"""Process hosts reused across processes (``IdleHosts``), on real processes.

A host whose process ended serves the manager's next start. What must hold
for that to be safe: nothing of the previous process survives into the next
one (stragglers, signals, kills, fds), every handle keeps its own record,
and idle hosts go away with the workspace, after their idle time, or when
they die.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

import corral
from corral.provider import ProcessManager, ProcessRequest, Workspace
from corral_posix import TmpdirWorkspaceProvider, _prochost_launch
from corral_posix import _processes as processes_module

from .test_processes import alive, gone

pytestmark = pytest.mark.anyio


class ProcProvider(TmpdirWorkspaceProvider):
    """A tmpdir provider with the ``process`` module."""

    provider_id: ClassVar[str] = "proc-pool-test"
    capabilities: ClassVar[frozenset[str]] = frozenset({"fs", "shell", "process"})


async def _open(tmp_path: Path) -> Workspace:
    provider = ProcProvider(tmpdir_root=str(tmp_path))
    opened = await provider.open(corral.ProviderConfig("proc-pool-test"), corral.SessionRef("t"))
    return opened.workspace


@pytest.fixture
async def ws(tmp_path: Path) -> AsyncIterator[Workspace]:
    workspace = await _open(tmp_path)
    try:
        yield workspace
    finally:
        await workspace.close()


def pm_of(ws: Workspace) -> ProcessManager:
    module = ws.module("process")
    assert isinstance(module, ProcessManager)
    return module


async def start(pm: ProcessManager, command: str, **kw: Any) -> str:
    info = await pm.start(ProcessRequest(command, allow_shell_syntax=True, **kw))
    return info.process_id


async def first_line(pm: ProcessManager, pid: str) -> list[int]:
    """The numbers on the first line of stdout."""
    seen = b""
    cursor = 0
    while b"\n" not in seen:
        chunk = await pm.read(pid, cursor=cursor, wait_s=10)
        assert chunk.data or not chunk.ended, seen
        seen += chunk.data
        cursor = chunk.next_cursor
    return [int(x) for x in seen.split(b"\n", 1)[0].split()]


async def freed(pm: ProcessManager) -> None:
    """Wait until every ended process's host said it is free (a loaded machine may delay it).

    A host that has not said so yet is not reused (the start takes a fresh
    one): right, but not what these tests are about.
    """
    assert isinstance(pm, processes_module.HostProcessManager)
    for _ in range(1000):
        for live in pm._ended_hosts():
            pm._free_host(live)
        if not pm._ending:
            return
        await anyio.sleep(0.01)
    raise AssertionError("an ended process's host never said it is free")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def ended_on_host(pm: ProcessManager, command: str) -> tuple[str, int]:
    """Run ``command`` (which prints ``$PPID`` first) to its end; its id and its host's pid."""
    pid = await start(pm, command)
    host = (await first_line(pm, pid))[-1]
    info = await pm.wait(pid, timeout_s=10)
    assert info.state == "exited"
    await freed(pm)
    return pid, host


async def test_the_next_process_runs_on_the_same_host_and_nothing_of_the_last_survives(
    ws: Workspace,
) -> None:
    """Start A (leaving a setsid'd straggler), let it end, start B on its host, kill B's tree."""
    pm = pm_of(ws)
    a = await start(pm, "setsid sleep 1000 & echo $! $PPID")
    a_straggler, host = await first_line(pm, a)
    a_info = await pm.wait(a, timeout_s=10)
    assert (a_info.state, a_info.exit_code) == ("exited", 0)
    await freed(pm)
    assert await gone(a_straggler)  # the host killed A's whole tree before it was free
    assert alive(host)
    b = await start(pm, "setsid sleep 1000 & echo $! $PPID; echo done >&2; sleep 1000")
    b_straggler, b_host = await first_line(pm, b)
    assert b_host == host, "the ended process's host did not serve the next start"
    assert alive(b_straggler)
    chunk = await pm.read(b, "stderr", cursor=0, wait_s=10)
    assert chunk.data == b"done\n"
    killed = await pm.kill(b)
    assert (killed.state, killed.signal) == ("killed", signal.SIGKILL)
    assert await gone(b_straggler)
    # Each handle kept its own record: A's end and output are untouched.
    after = await pm.info(a)
    assert (after.state, after.exit_code, after.ended_at) == ("exited", 0, a_info.ended_at)
    assert (after.stdout_end, after.stderr_end) == (a_info.stdout_end, 0)
    assert alive(host)


async def test_signals_and_kills_for_an_ended_process_never_reach_the_next(
    ws: Workspace,
) -> None:
    """A signal, a kill or a wait for A sent after A ended is dropped, not applied to B."""
    pm = pm_of(ws)
    a = await start(pm, "echo $PPID")
    (host,) = await first_line(pm, a)
    assert isinstance(pm, processes_module.HostProcessManager)
    record = Path(pm.records) / a
    while not (record / "final.json").exists():
        await anyio.sleep(0.01)
    # Sent before this manager learned of the end: they wait on the host's socket.
    live = pm._live[a]
    assert live.send(b"G" + processes_module._SIG.pack(signal.SIGTERM))
    assert live.send(b"Kkilled")
    await pm.wait(a, timeout_s=10)
    await freed(pm)
    b = await start(pm, "echo $PPID; trap 'echo TERM' TERM; sleep 1000 & wait; sleep 1000")
    assert (await first_line(pm, b)) == [host]
    # And sent after: the ended handle no longer reaches any host.
    await pm.signal(a, signal.SIGTERM)
    assert (await pm.kill(a)).state == "exited"
    await anyio.sleep(0.3)
    info = await pm.info(b)
    assert info.state == "running"
    assert info.stdout_end == len(f"{host}\n"), "a signal for the ended process reached the next"
    await pm.kill(b)


async def test_a_reused_host_keeps_no_fds_of_earlier_processes(ws: Workspace) -> None:
    pm = pm_of(ws)
    _pid, host = await ended_on_host(pm, "echo $PPID; echo err >&2")
    counts = []
    for _ in range(4):
        _pid, again = await ended_on_host(pm, "echo $PPID; echo err >&2")
        assert again == host
        counts.append(fd_count(host))
    assert len(set(counts)) == 1, counts


async def test_closing_the_workspace_ends_its_idle_hosts(tmp_path: Path) -> None:
    workspace = await _open(tmp_path)
    pm = pm_of(workspace)
    hosts = []
    for _ in range(2):  # two at once: two hosts, both idle afterwards
        first = await start(pm, "echo $PPID; sleep 0.3")
        second = await start(pm, "echo $PPID; sleep 0.3")
        hosts += (await first_line(pm, first)) + (await first_line(pm, second))
        await pm.wait(first, timeout_s=10)
        await pm.wait(second, timeout_s=10)
        await freed(pm)
    assert len(set(hosts)) == 2, "the second pair did not reuse the first pair's hosts"
    assert all(alive(h) for h in hosts)
    await workspace.close()
    for h in hosts:
        assert await gone(h), "an idle host outlived its workspace"


async def test_an_idle_host_exits_after_its_idle_time(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_prochost_launch, "HOST_IDLE_S", 0.3)
    pm = pm_of(ws)
    _pid, host = await ended_on_host(pm, "echo $PPID")
    assert await gone(host)
    pid, other = await ended_on_host(pm, "echo $PPID")
    assert other != host
    assert (await pm.info(pid)).exit_code == 0


async def test_an_idle_host_that_died_is_replaced(ws: Workspace) -> None:
    pm = pm_of(ws)
    _pid, host = await ended_on_host(pm, "echo $PPID")
    os.kill(host, signal.SIGKILL)
    assert await gone(host)
    pid, other = await ended_on_host(pm, "echo $PPID; echo served")
    assert other != host
    chunk = await pm.read(pid, cursor=0)
    assert chunk.data.endswith(b"served\n")


async def test_a_reused_host_that_dies_leaves_its_process_lost(ws: Workspace) -> None:
    """Crash safety is the same on a reused host: its tree dies, the record reads ``lost``."""
    pm = pm_of(ws)
    a, host = await ended_on_host(pm, "echo $PPID")
    b = await start(pm, "echo $PPID $$; (setsid sleep 1000 &) ; sleep 1000")
    b_host, b_shell = await first_line(pm, b)
    assert b_host == host
    os.kill(host, signal.SIGKILL)
    assert await gone(b_shell)
    assert (await pm.wait(b, timeout_s=10)).state == "lost"
    assert (await pm.info(a)).state == "exited"
