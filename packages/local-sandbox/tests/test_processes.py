"""The ``process`` module inside bubblewrap: terminals, loopback, trees, guards, quota."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

import corral
from corral.provider import (
    CommandRequest,
    OperationError,
    ProcessManager,
    ProcessRequest,
    TerminalSize,
    Workspace,
)
from corral_local_sandbox import LocalSandboxProvider

pytestmark = pytest.mark.bwrap


class ProcSandbox(LocalSandboxProvider):
    """local-sandbox with the ``process`` module (registered by core later)."""

    capabilities: ClassVar[frozenset[str]] = LocalSandboxProvider.capabilities | {"process"}


OpenWs = Callable[..., AbstractAsyncContextManager[Workspace]]


@pytest.fixture
def open_pws(tmp_path: Path) -> OpenWs:
    @asynccontextmanager
    async def opener(
        declared: frozenset[str] | None = None, **options: Any
    ) -> AsyncIterator[Workspace]:
        options.setdefault("tmpdir_root", str(tmp_path))
        provider = ProcSandbox(**options)
        opened = await provider.open(
            corral.ProviderConfig("local-sandbox"), corral.SessionRef("p"), declared
        )
        try:
            yield opened.workspace
        finally:
            await opened.workspace.close()

    return opener


def pm_of(ws: Workspace) -> ProcessManager:
    module = ws.module("process")
    assert isinstance(module, ProcessManager)
    return module


async def start(pm: ProcessManager, command: str, **kw: Any) -> str:
    return (await pm.start(ProcessRequest(command, allow_shell_syntax=True, **kw))).process_id


async def read_until(
    pm: ProcessManager, pid: str, needle: bytes, cursor: int = 0, *, within_s: float = 30
) -> int:
    seen = b""
    base = cursor
    deadline = anyio.current_time() + within_s
    while anyio.current_time() < deadline:
        chunk = await pm.read(pid, cursor=cursor, wait_s=1)
        seen += chunk.data
        cursor = chunk.next_cursor
        if needle in seen:
            return base + seen.index(needle) + len(needle)  # just after the needle
        assert not chunk.ended, seen
    raise AssertionError(f"never saw {needle!r}: {seen[-500:]!r} ({await pm.info(pid)})")


async def read_all(pm: ProcessManager, pid: str, stream: Any = "stdout") -> bytes:
    out = b""
    cursor = 0
    for _ in range(100):
        chunk = await pm.read(pid, stream, cursor=cursor, wait_s=5)
        out += chunk.data
        cursor = chunk.next_cursor
        if chunk.ended:
            return out
    raise AssertionError(out)


def sandbox_pids(marker: str) -> list[int]:
    """Host pids whose command line names ``marker`` (bwrap binds the workspace by path)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


async def none_left(marker: str) -> bool:
    for _ in range(500):
        if not sandbox_pids(marker):
            return True
        await anyio.sleep(0.01)
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.anyio
async def test_process_only_workspace_is_still_sandboxed(open_pws: OpenWs) -> None:
    # The class of bug: a module that runs commands built without the sandbox.
    async with open_pws(frozenset({"process"})) as ws:
        pm = pm_of(ws)
        pid = await start(pm, "pwd; id -u; ls /home")
        assert await read_all(pm, pid) == b"/workspace\n1000\nsandbox\n"


@pytest.mark.anyio
async def test_exec_failures_are_127_and_126(open_pws: OpenWs) -> None:
    async with open_pws() as ws:
        pm = pm_of(ws)
        missing = (await pm.start(ProcessRequest("no-such-program-xyz"))).process_id
        assert (await pm.wait(missing, timeout_s=20)).exit_code == 127
        assert ws.fs is not None
        await ws.fs.write_file("script.sh", b"#!/bin/sh\necho hi\n")
        denied = (await pm.start(ProcessRequest("./script.sh"))).process_id
        assert (await pm.wait(denied, timeout_s=20)).exit_code == 126


@pytest.mark.anyio
async def test_loopback_server_with_network_off(open_pws: OpenWs) -> None:
    # Network off: each sandbox has a loopback of its own, so a client in the
    # same process tree reaches the server, and a later command cannot.
    port = free_port()
    async with open_pws() as ws:
        assert ws.fs is not None
        await ws.fs.write_file("index.html", b"inside\n")
        client = (
            'python3 -c "import urllib.request as u; '
            f"print(u.urlopen('http://127.0.0.1:{port}/index.html').read().decode())\""
        )
        pm = pm_of(ws)
        pid = await start(
            pm,
            f"python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 & "
            f"for i in 1 2 3 4 5 6 7 8 9 10; do {client} 2>/dev/null && break; sleep 0.3; done; "
            "echo client-done; wait",
        )
        await read_until(pm, pid, b"inside\n\nclient-done")
        assert ws.shell is not None
        other = await ws.shell.run(CommandRequest(client, allow_shell_syntax=True, timeout_s=20))
        assert other.exit_code != 0  # another sandbox, another loopback
        await pm.kill(pid)


@pytest.mark.anyio
async def test_loopback_server_with_network_on_answers_later_commands(open_pws: OpenWs) -> None:
    port = free_port()
    async with open_pws(network="on") as ws:
        assert ws.fs is not None
        await ws.fs.write_file("index.html", b"shared\n")
        pm = pm_of(ws)
        pid = await start(pm, f"exec python3 -u -m http.server {port} --bind 127.0.0.1")
        await read_until(pm, pid, b"Serving HTTP")
        client = (
            'python3 -c "import urllib.request as u; '
            f"print(u.urlopen('http://127.0.0.1:{port}/index.html').read().decode())\""
        )
        assert ws.shell is not None
        result = await ws.shell.run(CommandRequest(client, allow_shell_syntax=True, timeout_s=20))
        assert result.stdout == "shared\n\n", result
        await pm.kill(pid)


@pytest.mark.anyio
async def test_terminal_inside_the_sandbox_is_a_controlling_tty(open_pws: OpenWs) -> None:
    async with open_pws() as ws:
        pm = pm_of(ws)
        request = ProcessRequest("python3 -i -q", terminal=TerminalSize(cols=90, rows=30))
        pid = (await pm.start(request)).process_id
        cursor = await read_until(pm, pid, b">>> ")
        await pm.write_stdin(
            pid,
            b"import os; print(os.isatty(0), os.tcgetpgrp(0) == os.getpgrp(), "
            b"os.get_terminal_size(0), open('/dev/tty').name)\r",
        )
        cursor = await read_until(
            pm, pid, b"True True os.terminal_size(columns=90, lines=30) /dev/tty", cursor
        )
        await pm.write_stdin(pid, b"import time; time.sleep(1000)\r")
        await anyio.sleep(0.3)
        await pm.write_stdin(pid, b"\x03")  # ^C reaches the foreground group as SIGINT
        cursor = await read_until(pm, pid, b"KeyboardInterrupt", cursor)
        await read_until(pm, pid, b">>> ", cursor)
        # (os._exit: CPython's REPL exits by SIGINT at EOF once it printed a KeyboardInterrupt.)
        await pm.write_stdin(pid, b"os._exit(7)\r")
        info = await pm.wait(pid, timeout_s=20)
        assert (info.state, info.exit_code) == ("exited", 7), info


@pytest.mark.anyio
async def test_full_screen_programs_and_job_control(open_pws: OpenWs) -> None:
    async with open_pws() as ws:
        assert ws.fs is not None
        await ws.fs.write_file("long.txt", "".join(f"line {i}\n" for i in range(300)).encode())
        pm = pm_of(ws)
        pid = await start(pm, "less long.txt", terminal=TerminalSize(cols=80, rows=10))
        cursor = await read_until(pm, pid, b"line 8")
        # SIGWINCH: less redraws taller. A loaded machine can deliver the first one
        # while less is still starting up and ignores it, so the size changes again
        # (20 -> 21 -> 22 rows, each a new SIGWINCH) before the test gives up.
        for attempt, rows in enumerate((20, 21, 22)):
            await pm.resize(pid, TerminalSize(cols=80, rows=rows))
            try:
                cursor = await read_until(pm, pid, b"line 18", cursor, within_s=10)
                break
            except AssertionError:
                if attempt == 2:
                    raise
        await pm.write_stdin(pid, b"q")
        assert (await pm.wait(pid, timeout_s=20)).exit_code == 0

        pid = await start(pm, "vi -u NONE note.txt", terminal=TerminalSize(cols=80, rows=24))
        await anyio.sleep(0.5)
        await pm.write_stdin(pid, b"ihello from vi\x1b:wq\r")
        assert (await pm.wait(pid, timeout_s=20)).exit_code == 0
        assert await ws.fs.read_file("note.txt") == b"hello from vi\n"

        pid = await start(pm, "bash --norc --noprofile -i", terminal=TerminalSize())
        cursor = await read_until(pm, pid, b"$ ")
        await pm.write_stdin(pid, b"sleep 1000 & jobs; echo job-$?\r")
        cursor = await read_until(pm, pid, b"job-0", cursor)
        await pm.write_stdin(pid, b"kill %1; wait; exit 7\r")
        info = await pm.wait(pid, timeout_s=20)
        assert (info.state, info.exit_code) == ("exited", 7)


@pytest.mark.anyio
async def test_kill_and_close_leave_no_sandbox_process(open_pws: OpenWs, tmp_path: Path) -> None:
    async with open_pws() as ws:
        root = str(ws.details()["root"])
        pm = pm_of(ws)
        pid = await start(pm, "(setsid sh -c 'sleep 1000 &' &) ; sleep 1000")
        await anyio.sleep(0.3)
        assert sandbox_pids(root)
        await pm.kill(pid)
        assert await none_left(root)
        for _ in range(3):
            await start(pm, "(setsid sleep 1000 &) ; sleep 1000")
        await anyio.sleep(0.3)
        assert sandbox_pids(root)
    assert await none_left(root)


@pytest.mark.anyio
async def test_a_planted_protected_path_is_quarantined_while_it_runs(open_pws: OpenWs) -> None:
    async with open_pws() as ws:
        assert ws.fs is not None
        root = Path(str(ws.details()["root"]))
        pm = pm_of(ws)
        pid = await start(
            pm,
            "mkdir -p .git/hooks && printf '#!/bin/sh\\necho pwned\\n' > .git/hooks/pre-commit "
            "&& chmod +x .git/hooks/pre-commit && echo planted && sleep 1000",
        )
        await read_until(pm, pid, b"planted")
        # No command ran since: only the process monitor can have moved it.
        for _ in range(200):
            if not (root / ".git/hooks/pre-commit").exists():
                break
            await anyio.sleep(0.05)
        assert not (root / ".git/hooks/pre-commit").exists()
        assert (await pm.info(pid)).state == "running"
        await pm.kill(pid)


@pytest.mark.anyio
async def test_disk_quota_binds_background_processes(open_pws: OpenWs) -> None:
    async with open_pws(limits={"disk_bytes": 4 << 20}) as ws:
        pm = pm_of(ws)
        pid = await start(
            pm,
            "for i in 1 2 3 4 5 6; do head -c 3000000 /dev/zero > big$i.bin; done; sleep 1000",
        )
        info = await pm.wait(pid, timeout_s=30)
        assert (info.state, info.reason) == ("killed", "the workspace exceeded its disk quota")
        with pytest.raises(OperationError) as exc:
            await pm.start(ProcessRequest("echo refused"))
        assert exc.value.code == "policy_denied"
        assert ws.fs is not None
        for i in range(1, 7):
            await ws.fs.rm(f"big{i}.bin")
        pid = await start(pm, "echo allowed-again")
        assert await read_all(pm, pid) == b"allowed-again\n"


def test_terminal_launch_keeps_new_session_and_takes_the_tty_inside() -> None:
    from corral_local_sandbox._bwrap import BwrapFeatures, BwrapWrapper
    from corral_local_sandbox._policy import SandboxPolicy
    from corral_local_sandbox._provider import _terminal_wrapper
    from corral_posix import WrapContext

    inner = BwrapWrapper(
        bwrap="/usr/bin/bwrap",
        policy=SandboxPolicy(),
        features=BwrapFeatures(),
        seccomp_file="/x/filter.bpf",
    )
    ctx = WrapContext("/tmp/ws", "/tmp/ws", {"PATH": "/usr/bin"})
    term = _terminal_wrapper(inner)
    assert term is not None
    argv = term.wrap(["python3", "-i"], ctx).argv
    flags = argv[argv.index("/usr/bin/bwrap") : argv.index("--", argv.index("/usr/bin/bwrap"))]
    assert "--new-session" in flags  # CVE-2017-5226: the sandbox's own session stays
    assert argv[-5:-2] == (argv[-5], "--ctty", "--wait")
    assert argv[-5].endswith("/setsid")
    assert argv[-2:] == ("python3", "-i")
