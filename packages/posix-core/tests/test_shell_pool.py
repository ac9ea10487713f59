"""The pooled reapers behind SubprocessShell: reuse, isolation, failure, fork."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from corral.provider import CommandRequest, ExecResult, OperationError
from corral_posix import ProcessLimits, SubprocessShell
from corral_posix import _supervisor as supervisor_module

pytestmark = pytest.mark.anyio

WHO = "sh -c 'echo $PPID'"


@pytest.fixture
async def shell(tmp_path: Path) -> AsyncIterator[SubprocessShell]:
    sh = SubprocessShell(tmp_path)
    yield sh
    await sh.aclose()


async def run(sh: SubprocessShell, command: str, **kw: object) -> ExecResult:
    return await sh.run(CommandRequest(command, **kw))  # type: ignore[arg-type]


async def reaper_of(sh: SubprocessShell) -> int:
    result = await run(sh, WHO)
    assert result.exit_code == 0, result
    return int(result.stdout)


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or gone between open and read
        return False


async def wait_dead(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        await anyio.sleep(0.02)
    return False


async def test_reaper_is_reused_without_leaking_cwd_or_env(
    shell: SubprocessShell, tmp_path: Path
) -> None:
    (tmp_path / "sub").mkdir()
    first = await reaper_of(shell)
    probe = "sh -c 'echo $PPID; pwd; echo ${FOO-unset}'"
    inside = await run(shell, probe, cwd="/sub", env={"FOO": "1"})
    assert inside.stdout.split() == [str(first), str(tmp_path / "sub"), "1"]
    after = await run(shell, probe)
    assert after.stdout.split() == [str(first), str(tmp_path), "unset"]
    # Between commands the reaper does not keep the workspace directory open.
    assert os.readlink(f"/proc/{first}/cwd") == "/"


async def test_reused_reaper_has_no_leftover_processes(shell: SubprocessShell) -> None:
    daemon = (
        "setsid sh -c 'sleep 300 & echo $! > d.pid; sleep 300' </dev/null >/dev/null 2>&1 & "
        "while [ ! -s d.pid ]; do sleep 0.01; done; cat d.pid; echo $PPID"
    )
    result = await run(shell, daemon, allow_shell_syntax=True, timeout_s=20)
    daemon_pid, reaper = (int(x) for x in result.stdout.split())
    assert not alive(daemon_pid)
    assert children(reaper) == []  # the whole tree was reaped before run returned
    assert await reaper_of(shell) == reaper


async def test_pools_per_limits_keep_their_own_rlimits(tmp_path: Path) -> None:
    low = SubprocessShell(tmp_path, limits=ProcessLimits(open_files=77, file_size_bytes=5120))
    default = SubprocessShell(tmp_path)
    probe = "sh -c 'echo $PPID; ulimit -n; ulimit -f'"
    try:
        seen: dict[str, set[int]] = {"low": set(), "default": set()}
        for _ in range(3):
            a = (await run(low, probe)).stdout.split()
            b = (await run(default, probe)).stdout.split()
            assert a[1:] == ["77", "10"]
            assert b[1:] == ["1024", str((1 << 30) // 512)]
            seen["low"].add(int(a[0]))
            seen["default"].add(int(b[0]))
        assert not seen["low"] & seen["default"]
    finally:
        await low.aclose()
        await default.aclose()


async def test_killed_reaper_fails_cleanly_and_is_replaced(
    shell: SubprocessShell, tmp_path: Path
) -> None:
    command = "echo $PPID > r.pid; sleep 300 & echo $! > c.pid; wait"
    failure: list[OperationError] = []

    async def victim() -> None:
        with pytest.raises(OperationError) as info:
            await run(shell, command, allow_shell_syntax=True, timeout_s=60)
        failure.append(info.value)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(victim)
            while not (tmp_path / "c.pid").exists() or not (tmp_path / "c.pid").read_text():
                await anyio.sleep(0.01)
            reaper = int((tmp_path / "r.pid").read_text())
            os.kill(reaper, signal.SIGKILL)
    assert failure[0].code == "failed"
    assert "reaper" in failure[0].message
    # The supervisor inherits the orphans and kills them.
    assert await wait_dead(int((tmp_path / "c.pid").read_text()))
    replacement = await reaper_of(shell)
    assert replacement != reaper


async def test_idle_reaper_that_died_or_quit_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    # A limits value no other test (or backend) uses, so its pool starts empty.
    unique = {"asyncio": 313, "trio": 314}[anyio_backend]
    sh = SubprocessShell(tmp_path, limits=ProcessLimits(open_files=unique))
    try:
        monkeypatch.setattr(supervisor_module, "REAPER_IDLE_S", 0.2)
        quitter = await reaper_of(sh)
        assert await wait_dead(quitter)  # idle too long: it exited by itself
        killed = await reaper_of(sh)
        assert killed != quitter
        monkeypatch.setattr(supervisor_module, "REAPER_IDLE_S", 30.0)
        os.kill(killed, signal.SIGKILL)
        assert await wait_dead(killed)
        again = await run(sh, "echo ok")
        assert (again.exit_code, again.stdout) == (0, "ok\n")
    finally:
        await sh.aclose()


async def test_many_concurrent_runs_get_their_own_reaper(shell: SubprocessShell) -> None:
    n = 24
    outputs: dict[int, list[str]] = {}

    async def one(i: int) -> None:
        result = await run(shell, f"sh -c 'sleep 0.3; echo {i} $PPID'", timeout_s=60)
        assert result.exit_code == 0
        outputs[i] = result.stdout.split()

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    elapsed = time.monotonic() - started
    assert sorted(int(v[0]) for v in outputs.values()) == list(range(n))
    assert len({v[1] for v in outputs.values()}) == n  # one command per reaper at a time
    assert elapsed < n * 0.3 / 2
    assert supervisor_module.POOL.idle_count(shell._limits_key) <= 8
    assert await reaper_of(shell) in {int(v[1]) for v in outputs.values()}


async def test_cancelled_run_leaves_a_reusable_reaper(shell: SubprocessShell) -> None:
    reaper = await reaper_of(shell)
    with anyio.move_on_after(0.5):
        await run(shell, "sleep 100", timeout_s=60)
    assert children(reaper) == []
    assert await reaper_of(shell) == reaper


FORK_SCRIPT = """
import os, sys, anyio
from corral.provider import CommandRequest
from corral_posix import SubprocessShell

def ppid(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])

async def reaper_of(sh):
    return int((await sh.run(CommandRequest("sh -c 'echo $PPID'"))).stdout)

sh = SubprocessShell(sys.argv[1])
before = anyio.run(reaper_of, sh)
child = os.fork()
if child == 0:
    code = 1
    try:
        mine = anyio.run(reaper_of, sh, backend=sys.argv[2])
        print("child", os.getpid(), mine, ppid(ppid(mine)), flush=True)
        code = 0
    finally:
        os._exit(code)
assert os.waitpid(child, 0)[1] == 0
after = anyio.run(reaper_of, sh, backend=sys.argv[2])
print("parent", os.getpid(), before, after, ppid(ppid(after)), flush=True)
"""


async def test_forked_host_gets_its_own_pool(tmp_path: Path, anyio_backend: str) -> None:
    result = await anyio.run_process(
        [sys.executable, "-c", FORK_SCRIPT, str(tmp_path), anyio_backend],
        stdout=subprocess.PIPE,
        check=True,
    )
    lines = dict(line.split(" ", 1) for line in result.stdout.decode().splitlines())
    child_pid, child_reaper, child_grand = (int(x) for x in lines["child"].split())
    parent_pid, before, after, parent_grand = (int(x) for x in lines["parent"].split())
    assert child_grand == child_pid  # the child's reaper hangs off the child's supervisor
    assert parent_grand == parent_pid
    assert child_reaper not in {before, after}
    assert after == before  # the fork did not disturb the parent's pool


async def test_a_stale_kill_does_not_hit_the_next_command(shell: SubprocessShell) -> None:
    await run(shell, "true")
    results: list[ExecResult] = []

    async def second() -> None:
        results.append(await run(shell, "sh -c 'sleep 0.5; echo done'", timeout_s=30))

    async with anyio.create_task_group() as tg:
        tg.start_soon(second)
        while not shell._active:
            await anyio.sleep(0.01)
        ((reaper, seq),) = shell._active.items()
        reaper.kill(seq - 1)  # meant for the previous command on this reaper
    assert (results[0].exit_code, results[0].stdout) == (0, "done\n")
