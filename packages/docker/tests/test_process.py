"""The ``process`` module on the real engine: handles, cursors, stdin, terminals, lifetimes.

Derived from :class:`corral.provider.ProcessManager`'s contract: cursors are
byte offsets counted before decoding; a cursor before the retained window is
:class:`CursorExpiredError` naming the earliest; killing a handle kills its
whole tree; closing the workspace kills every process; a host program that
dies leaves its handles ``lost`` (with their recorded output) on resolve.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator

import anyio
import anyio.to_thread
import pytest

import corral
import corral.provider
from corral.provider import (
    CursorExpiredError,
    ProcessManager,
    ProcessRequest,
    TerminalSize,
)
from corral_docker import DockerProvider
from corral_docker._processes import DockerProcessManager

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


class _Box:
    def __init__(self, ws: corral.provider.Workspace, pm: ProcessManager) -> None:
        self.ws = ws
        self.pm = pm

    @property
    def records(self) -> str:
        assert isinstance(self.pm, DockerProcessManager)
        return self.pm.records

    @property
    def container_id(self) -> str:
        return str(corral.provider.describe_workspace(self.ws)["container_id"])

    async def sh(self, command: str) -> corral.ExecResult:
        assert self.ws.shell is not None
        return await self.ws.shell.run(
            corral.provider.CommandRequest(command, allow_shell_syntax=True)
        )


@pytest.fixture
async def box(docker_ready: None, image: str, tmp_root: str) -> AsyncIterator[_Box]:
    provider = DockerProvider(image=image, tmpdir_root=tmp_root)
    opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("proc"))
    try:
        assert "process" in opened.ref.capabilities
        yield _Box(opened.workspace, _pm(opened.workspace))
    finally:
        await opened.workspace.close()
        await provider.aclose()


def _pm(ws: corral.provider.Workspace) -> ProcessManager:
    module = getattr(ws, "module", None)
    assert module is not None
    pm = module("process")
    assert isinstance(pm, ProcessManager)
    return pm


def _start(command: str, **kw: object) -> ProcessRequest:
    return ProcessRequest(command, allow_shell_syntax=True, **kw)  # type: ignore[arg-type]


async def _read_all(pm: ProcessManager, pid: str, stream: str = "stdout") -> bytes:
    out, cursor = b"", 0
    while True:
        chunk = await pm.read(pid, stream, cursor=cursor, max_bytes=1 << 20, wait_s=5)  # type: ignore[arg-type]
        out += chunk.data
        cursor = chunk.next_cursor
        if chunk.ended:
            return out


async def test_start_read_wait_exit(box: _Box) -> None:
    info = await box.pm.start(_start("echo out; echo err >&2; exit 3"))
    assert info.state == "running"
    done = await box.pm.wait(info.process_id, timeout_s=30)
    assert (done.state, done.exit_code, done.signal) == ("exited", 3, None)
    assert (done.stdout_end, done.stderr_end) == (4, 4)
    assert await _read_all(box.pm, info.process_id) == b"out\n"
    assert await _read_all(box.pm, info.process_id, "stderr") == b"err\n"
    # Resume mid-stream: no byte twice, none skipped.
    tail = await box.pm.read(info.process_id, cursor=2)
    # The process has ended and the chunk reaches the end: ended, exactly.
    assert (tail.data, tail.next_cursor, tail.ended) == (b"t\n", 4, True)
    end = await box.pm.read(info.process_id, cursor=4)
    assert (end.data, end.ended) == (b"", True)
    with pytest.raises(corral.OperationError) as beyond:
        await box.pm.read(info.process_id, cursor=5)
    assert beyond.value.code == "invalid_argument"
    missing = await box.pm.start(_start("no-such-program-x"))
    assert (await box.pm.wait(missing.process_id, timeout_s=30)).exit_code == 127
    with pytest.raises(corral.OperationError) as no_cwd:
        await box.pm.start(_start("true", cwd="/nope"))
    assert no_cwd.value.code == "not_found"
    with pytest.raises(corral.OperationError) as denied:
        await box.pm.start(ProcessRequest("echo a; echo b"))  # shell syntax not allowed
    assert denied.value.code == "policy_denied"


async def test_output_is_readable_while_the_process_runs(box: _Box) -> None:
    info = await box.pm.start(_start("echo early; sleep 30"))
    chunk = await box.pm.read(info.process_id, cursor=0, wait_s=20)
    assert chunk.data == b"early\n"
    assert (await box.pm.info(info.process_id)).state == "running"
    waited = await box.pm.read(info.process_id, cursor=chunk.next_cursor, wait_s=0.2)
    assert (waited.data, waited.ended) == (b"", False)
    with pytest.raises(corral.OperationError) as running:
        await box.pm.remove(info.process_id)
    assert running.value.code == "invalid_argument"
    killed = await box.pm.kill(info.process_id)
    assert (killed.state, killed.reason) == ("killed", "killed")
    await box.pm.remove(info.process_id)
    with pytest.raises(corral.OperationError) as gone:
        await box.pm.info(info.process_id)
    assert gone.value.code == "not_found"
    assert info.process_id not in [i.process_id for i in await box.pm.list()]


async def test_fifty_mib_and_arbitrary_bytes_through_stdin(box: _Box) -> None:
    data = (bytes(range(256)) * 4096 * 50)[: 50 << 20]
    info = await box.pm.start(_start("sha256sum"))
    await box.pm.write_stdin(info.process_id, data)
    await box.pm.close_stdin(info.process_id)
    await box.pm.close_stdin(info.process_id)  # idempotent
    await box.pm.wait(info.process_id, timeout_s=120)
    out = await _read_all(box.pm, info.process_id)
    assert out.split()[0].decode() == hashlib.sha256(data).hexdigest()
    raw = b"\0\xff\xfe\x80\r\n\x1b[A end"
    echo = await box.pm.start(_start("cat"))
    await box.pm.write_stdin(echo.process_id, raw)
    await box.pm.close_stdin(echo.process_id)
    await box.pm.wait(echo.process_id, timeout_s=30)
    assert await _read_all(box.pm, echo.process_id) == raw
    with pytest.raises(corral.OperationError) as closed:
        await box.pm.write_stdin(echo.process_id, b"late")
    assert closed.value.code == "closed"


async def test_kill_takes_the_whole_tree(box: _Box) -> None:
    info = await box.pm.start(
        _start("sleep 1001 & setsid sleep 1002 & (setsid sh -c 'sleep 1003 &') ; sleep 1004")
    )
    with anyio.fail_after(60):
        while (await box.sh("ps -o args")).stdout.count("sleep 100") < 4:
            await anyio.sleep(0.1)
    final = await box.pm.kill(info.process_id)
    assert final.state == "killed"
    assert (await box.pm.kill(info.process_id)).state == "killed"  # idempotent
    left = await box.sh("ps -o args")
    assert "sleep 100" not in left.stdout, left.stdout


async def test_timeout_kills(box: _Box) -> None:
    info = await box.pm.start(_start("sleep 1005 & sleep 1006", timeout_s=1.0))
    final = await box.pm.wait(info.process_id, timeout_s=30)
    assert (final.state, final.reason) == ("killed", "timeout")
    assert "sleep 100" not in (await box.sh("ps -o args")).stdout


async def test_signal_reaches_the_process_group(box: _Box) -> None:
    info = await box.pm.start(
        _start("trap 'echo got-term; exit 9' TERM; echo ready; while :; do sleep 0.1; done")
    )
    ready = await box.pm.read(info.process_id, cursor=0, wait_s=60)
    assert ready.data == b"ready\n"
    await box.pm.signal(info.process_id, 15)
    final = await box.pm.wait(info.process_id, timeout_s=30)
    assert (final.state, final.exit_code) == ("exited", 9)
    assert await _read_all(box.pm, info.process_id) == b"ready\ngot-term\n"


async def test_terminal_size_resize_and_input(box: _Box) -> None:
    # No line-editing shell: its cursor-position query (ESC[6n) would race the input.
    info = await box.pm.start(
        _start(
            "stty size; tty; read x; stty size; echo got-$x; exec cat",
            terminal=TerminalSize(cols=100, rows=30),
        )
    )
    assert info.terminal == TerminalSize(100, 30)
    out, cursor = b"", 0

    async def until(*wanted: bytes) -> None:
        nonlocal out, cursor
        with anyio.move_on_after(30):
            while not all(w in out for w in wanted):
                chunk = await box.pm.read(info.process_id, cursor=cursor, wait_s=5)
                out, cursor = out + chunk.data, chunk.next_cursor
        assert all(w in out for w in wanted), (wanted, out)

    await until(b"30 100", b"/dev/pts/")
    await box.pm.resize(info.process_id, TerminalSize(cols=120, rows=40))
    assert (await box.pm.info(info.process_id)).terminal == TerminalSize(120, 40)
    await box.pm.write_stdin(info.process_id, b"go\n")
    await until(b"40 120", b"got-go")
    await box.pm.write_stdin(info.process_id, b"echoed\n")
    await until(b"echoed\r\necho")  # the terminal's echo, then cat's copy
    await box.pm.close_stdin(info.process_id)  # ^D at the start of a line: EOF for cat
    final = await box.pm.wait(info.process_id, timeout_s=30)
    assert (final.state, final.exit_code) == ("exited", 0)
    err = await box.pm.read(info.process_id, "stderr")
    assert (err.data, err.ended, final.stderr_end) == (b"", True, 0)
    pipes = await box.pm.start(_start("true"))
    with pytest.raises(corral.OperationError) as no_tty:
        await box.pm.resize(pipes.process_id, TerminalSize())
    assert no_tty.value.code == "invalid_argument"


async def test_a_server_answers_on_loopback_inside_the_container(box: _Box) -> None:
    assert (await box.sh("echo served > hello.txt")).exit_code == 0
    server = await box.pm.start(_start("httpd -f -v -p 127.0.0.1:8080 -h /workspace"))
    got = ""
    with anyio.fail_after(30):
        while "served" not in got:
            got = (await box.sh("wget -qO- http://127.0.0.1:8080/hello.txt")).stdout
            await anyio.sleep(0.1)
    assert (await box.pm.info(server.process_id)).state == "running"
    await box.pm.kill(server.process_id)
    assert (await box.sh("wget -qO- http://127.0.0.1:8080/hello.txt")).exit_code != 0


async def test_retained_window_expires_old_cursors(box: _Box) -> None:
    info = await box.pm.start(
        _start("head -c 1048576 /dev/zero | tr '\\0' a; echo tail", retained_bytes=64 * 1024)
    )
    final = await box.pm.wait(info.process_id, timeout_s=60)
    assert final.stdout_end == 1048576 + 5
    # The disk never holds more than the window; most of it stays readable.
    records = pathlib.Path(box.records) / info.process_id / "stdout"
    on_disk = sum(p.stat().st_size for p in records.iterdir())
    assert 32 * 1024 <= on_disk == final.stdout_end - final.stdout_start <= 64 * 1024
    with pytest.raises(CursorExpiredError) as expired:
        await box.pm.read(info.process_id, cursor=0)
    assert expired.value.earliest == final.stdout_start
    rest = b""
    cursor = expired.value.earliest
    while True:
        chunk = await box.pm.read(info.process_id, cursor=cursor, max_bytes=10_000)
        rest, cursor = rest + chunk.data, chunk.next_cursor
        if chunk.ended:
            break
    assert rest == b"a" * (final.stdout_end - final.stdout_start - 5) + b"tail\n"


async def test_close_kills_every_process(docker_ready: None, image: str, tmp_root: str) -> None:
    provider = DockerProvider(image=image, tmpdir_root=tmp_root)
    opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("close"))
    ws = opened.workspace
    pm = _pm(ws)
    cid = str(corral.provider.describe_workspace(ws)["container_id"])
    try:
        ids = [
            (await pm.start(_start(cmd))).process_id
            for cmd in ("sleep 1011", "setsid sleep 1012 & sleep 1013", "sleep 1014")
        ]
        with anyio.fail_after(60):
            while (await anyio.to_thread.run_sync(_top, cid)).count("sleep 101") < 4:
                await anyio.sleep(0.1)
        # The module's close, before the container goes: nothing of theirs survives it.
        assert isinstance(pm, DockerProcessManager)
        await pm.aclose()
        assert "sleep 101" not in await anyio.to_thread.run_sync(_top, cid)
        with pytest.raises(corral.OperationError) as closed:
            await pm.list()
        assert closed.value.code == "closed"
        records = pathlib.Path(provider.layout.state_path(opened.ref.payload["workspace"]))
        for pid in ids:
            final = json.loads((records / "processes" / pid / "final.json").read_text())
            assert (final["state"], final["reason"]) == ("killed", "the workspace closed")
    finally:
        await ws.close()
        await provider.aclose()


def _top(container_id: str) -> str:
    out = subprocess.run(
        ["docker", "top", container_id], capture_output=True, text=True, timeout=30, check=True
    )
    return out.stdout


_CRASHER = textwrap.dedent(
    """
    import os, sys, time, anyio, corral
    from corral.provider import ProcessRequest
    from corral_docker import DockerProvider

    async def main():
        provider = DockerProvider(image=sys.argv[1], tmpdir_root=sys.argv[2])
        opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("crash"))
        pm = opened.workspace.module("process")
        info = await pm.start(ProcessRequest("echo recorded; sleep 1020", allow_shell_syntax=True))
        done = await pm.start(ProcessRequest("echo finished", allow_shell_syntax=True))
        await pm.wait(done.process_id, timeout_s=30)
        chunk = await pm.read(info.process_id, cursor=0, wait_s=30)
        assert chunk.data == b"recorded\\n", chunk
        print(corral.ref_to_json(opened.ref), flush=True)
        os._exit(0)  # no close, no cleanup: as if the program crashed

    anyio.run(main)
    """
)


async def test_crashed_host_leaves_handles_lost_with_their_output(
    docker_ready: None, image: str, tmp_root: str
) -> None:
    crashed = await anyio.run_process(
        [sys.executable, "-c", _CRASHER, image, tmp_root], check=False
    )
    assert crashed.returncode == 0, crashed.stderr.decode()[-2000:]
    ref = corral.ref_from_json(crashed.stdout.decode().strip().splitlines()[-1])
    provider = DockerProvider(image=image, tmpdir_root=tmp_root)
    ws = await provider.resolve(ref)
    try:
        pm = _pm(ws)
        infos = await pm.list()
        states = {info.command: info for info in infos}
        lost = states["echo recorded; sleep 1020"]
        assert (lost.state, lost.stdout_end) == ("lost", 9)
        assert states["echo finished"].state == "exited"
        assert await _read_all(pm, lost.process_id) == b"recorded\n"
        with pytest.raises(corral.OperationError):
            await pm.write_stdin(lost.process_id, b"x")
    finally:
        await ws.close()
        await provider.aclose()
    assert os.path.isdir(tmp_root)


async def test_processes_over_ssh(
    anyio_backend: str, ssh_ready: str, image: str, tmp_root: str
) -> None:
    if anyio_backend != "asyncio":
        pytest.skip("the ssh transport runs on one anyio backend (asyncio) to save wall time")
    provider = DockerProvider(image=image, tmpdir_root=tmp_root, base_url=ssh_ready)
    opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("ssh"))
    try:
        pm = _pm(opened.workspace)
        data = bytes(range(256)) * 4096
        info = await pm.start(_start("cat; echo bye >&2"))
        await pm.write_stdin(info.process_id, data)
        await pm.close_stdin(info.process_id)
        final = await pm.wait(info.process_id, timeout_s=60)
        assert (final.state, final.exit_code) == ("exited", 0)
        assert await _read_all(pm, info.process_id) == data
        assert await _read_all(pm, info.process_id, "stderr") == b"bye\n"
        tree = await pm.start(_start("setsid sleep 1031 & sleep 1032"))
        assert (await pm.kill(tree.process_id)).state == "killed"
        assert opened.workspace.shell is not None
        left = await opened.workspace.shell.run(corral.provider.CommandRequest("ps"))
        assert "sleep 103" not in left.stdout
    finally:
        await opened.workspace.close()
        await provider.aclose()
