"""The ``process`` module of tmpdir workspaces on real processes (no isolation)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

import corral
from corral.provider import (
    CommandRequest,
    CursorExpiredError,
    OperationError,
    ProcessManager,
    ProcessRequest,
    TerminalSize,
    Workspace,
)
from corral_posix import TmpdirWorkspaceProvider, _prochost_launch
from corral_posix import _processes as processes_module
from corral_posix._prochost_launch import PROCESS_HOSTS
from corral_posix._streamlog import segment_size

pytestmark = pytest.mark.anyio


class ProcProvider(TmpdirWorkspaceProvider):
    """A tmpdir provider with the ``process`` module (registered by core later)."""

    provider_id: ClassVar[str] = "proc-test"
    capabilities: ClassVar[frozenset[str]] = frozenset({"fs", "shell", "process"})


@pytest.fixture
async def ws(tmp_path: Path) -> AsyncIterator[Workspace]:
    provider = ProcProvider(tmpdir_root=str(tmp_path))
    opened = await provider.open(corral.ProviderConfig("proc-test"), corral.SessionRef("t"))
    try:
        yield opened.workspace
    finally:
        await opened.workspace.close()


def pm_of(ws: Workspace) -> ProcessManager:
    module = ws.module("process")
    assert isinstance(module, ProcessManager)
    return module


async def start(pm: ProcessManager, command: str, **kw: Any) -> str:
    info = await pm.start(ProcessRequest(command, allow_shell_syntax=True, **kw))
    assert info.state == "running"
    return info.process_id


async def read_all(
    pm: ProcessManager, pid: str, stream: Any = "stdout", *, max_bytes: int = 65536
) -> bytes:
    """Everything from cursor 0 to the end, resuming from each next_cursor."""
    out = bytearray()
    cursor = 0
    while True:
        chunk = await pm.read(pid, stream, cursor=cursor, max_bytes=max_bytes, wait_s=10)
        assert chunk.cursor == cursor
        assert chunk.next_cursor == cursor + len(chunk.data)
        out += chunk.data
        cursor = chunk.next_cursor
        if chunk.ended:
            return bytes(out)


async def read_until(pm: ProcessManager, pid: str, needle: bytes, cursor: int = 0) -> int:
    """Read until ``needle`` appeared after ``cursor``; return the cursor after it."""
    seen = b""
    base = cursor
    deadline = anyio.current_time() + 30
    while anyio.current_time() < deadline:
        chunk = await pm.read(pid, cursor=cursor, wait_s=1)
        seen += chunk.data
        cursor = chunk.next_cursor
        if needle in seen:
            return base + seen.index(needle) + len(needle)  # just after the needle
        assert not chunk.ended, seen
    raise AssertionError(f"never saw {needle!r}: {seen[-500:]!r}")


def disk_use(directory: Path) -> int:
    """Bytes in the segment files listed at one instant (each listed file is at most full)."""
    total = 0
    for entry in os.scandir(directory):
        with contextlib.suppress(FileNotFoundError):  # retention removed it since
            total += entry.stat().st_size
    return total


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone, or gone between open and read
        return False
    return state != b"Z"


async def gone(pid: int) -> bool:
    for _ in range(500):
        if not alive(pid):
            return True
        await anyio.sleep(0.01)
    return False


async def test_output_exit_code_and_exact_cursors(ws: Workspace) -> None:
    pm = pm_of(ws)
    pid = await start(pm, "printf 'hello\\nworld\\n'; printf oops >&2; exit 3")
    info = await pm.wait(pid, timeout_s=10)
    assert (info.state, info.exit_code, info.signal) == ("exited", 3, None)
    assert (info.stdout_end, info.stderr_end) == (12, 4)
    # One byte at a time: resuming from next_cursor neither repeats nor skips.
    assert await read_all(pm, pid, max_bytes=1) == b"hello\nworld\n"
    assert await read_all(pm, pid, "stderr") == b"oops"
    end = await pm.read(pid, cursor=12)
    assert (end.data, end.ended) == (b"", True)
    with pytest.raises(OperationError) as exc:
        await pm.read(pid, cursor=13)
    assert exc.value.code == "invalid_argument"


async def test_missing_and_non_executable_programs(ws: Workspace, tmp_path: Path) -> None:
    pm = pm_of(ws)
    missing = (await pm.start(ProcessRequest("no-such-program-xyz"))).process_id
    assert (await pm.wait(missing, timeout_s=10)).exit_code == 127
    assert b"command not found" in await read_all(pm, missing, "stderr")
    assert ws.fs is not None
    await ws.fs.write_file("script.sh", b"#!/bin/sh\necho hi\n")  # not executable
    denied = (await pm.start(ProcessRequest("./script.sh"))).process_id
    assert (await pm.wait(denied, timeout_s=10)).exit_code == 126


async def test_guard_refuses_before_anything_runs(ws: Workspace) -> None:
    pm = pm_of(ws)
    with pytest.raises(OperationError) as exc:
        await pm.start(ProcessRequest("echo hi; touch x"))  # shell syntax not allowed
    assert exc.value.code == "policy_denied"
    with pytest.raises(OperationError) as exc:
        await pm.start(ProcessRequest("ls", allowed_commands=frozenset({"echo"})))
    assert exc.value.code == "policy_denied"
    with pytest.raises(OperationError) as exc:
        await pm.start(ProcessRequest("ls", cwd="../.."))
    assert exc.value.code == "invalid_path"
    assert await pm.list() == []


async def test_read_waits_for_new_bytes_and_wakes_on_them(ws: Workspace) -> None:
    pm = pm_of(ws)
    pid = await start(pm, "read line; echo got-$line")
    empty = await pm.read(pid, cursor=0, wait_s=0)
    assert (empty.data, empty.ended) == (b"", False)
    async with anyio.create_task_group() as tg:

        async def feed() -> None:
            await anyio.sleep(0.2)
            await pm.write_stdin(pid, b"x\n")

        tg.start_soon(feed)
        # A long wait that returns with data proves it woke on the bytes.
        chunk = await pm.read(pid, cursor=0, wait_s=60)
    assert chunk.data == b"got-x\n"


def _spy_sends(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every message the manager sends to its process hosts after a start."""
    sent: list[bytes] = []
    real = processes_module._Live.send

    def spy(self: Any, message: bytes, fds: Any = ()) -> bool:
        sent.append(message)
        return bool(real(self, message, fds))

    monkeypatch.setattr(processes_module._Live, "send", spy)
    return sent


async def test_the_first_read_of_stdout_waits_on_the_wake_up_the_start_sent(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``D`` carries a wake-up for stdout at cursor 0: that read sends nothing and loses nothing."""
    pm = pm_of(ws)
    sent = _spy_sends(monkeypatch)
    pid = await start(pm, "sleep 0.3; printf abcdef")
    first = await pm.read(pid, cursor=0, max_bytes=2, wait_s=30)  # fewer than pushed
    assert (first.data, first.cursor, first.next_cursor) == (b"ab", 0, 2)
    assert not [m for m in sent if m[:1] == b"W"]  # it woke on the start's wake-up
    rest = await pm.read(pid, cursor=2, wait_s=30)
    assert rest.data == b"cdef"  # from the files: nothing lost, nothing twice
    await pm.wait(pid, timeout_s=10)

    # Another stream, or another cursor, first: each asks the host itself.
    sent.clear()
    pid = await start(pm, "sleep 0.3; printf err >&2; sleep 0.3; printf out")
    assert (await pm.read(pid, "stderr", cursor=0, wait_s=30)).data == b"err"
    assert [m[:1] for m in sent] == [b"W"]
    assert (await pm.read(pid, cursor=0, wait_s=30)).data == b"out"  # the start's, still there
    assert [m[:1] for m in sent] == [b"W"]
    await pm.wait(pid, timeout_s=10)

    sent.clear()
    pid = await start(pm, "printf 123; sleep 0.3; printf 456")
    assert await read_until(pm, pid, b"123") == 3
    sent.clear()
    assert (await pm.read(pid, cursor=3, wait_s=30)).data == b"456"
    assert (await pm.wait(pid, timeout_s=10)).exit_code == 0
    assert await read_all(pm, pid) == b"123456"


async def test_processes_seen_to_end_hold_no_fds(ws: Workspace) -> None:
    """Unread and unremoved: once info or wait saw the end, no fd of theirs stays open."""
    pm = pm_of(ws)
    await pm.wait((await pm.start(ProcessRequest("true"))).process_id, timeout_s=10)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        info = await pm.start(ProcessRequest("true"))
        assert (await pm.wait(info.process_id, timeout_s=10)).state == "exited"
    # Pooled idle hosts (at most 4) and the ready one may add a few; one per process may not.
    assert len(os.listdir("/proc/self/fd")) <= before + 6


async def test_a_start_sees_the_path_of_the_moment(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start environment is reused between starts, and rebuilt when PATH changes."""
    pm = pm_of(ws)
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "corral-probe-tool").write_text("#!/bin/sh\necho probe\n")
    (tools / "corral-probe-tool").chmod(0o755)
    missing = await pm.start(ProcessRequest("corral-probe-tool"))
    assert (await pm.wait(missing.process_id, timeout_s=10)).exit_code == 127
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    found = await pm.start(ProcessRequest("corral-probe-tool"))
    assert await read_all(pm, found.process_id) == b"probe\n"


async def test_waiting_on_a_closed_stream_of_a_running_process_does_not_spin(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its end is known only once the process ends: the wake-up comes then, not at once."""
    pm = pm_of(ws)
    pid = await start(pm, "echo bye; exec >&-; sleep 1000")
    end = await read_until(pm, pid, b"bye\n")
    looks = []
    real = processes_module._status_and_bytes

    def counted(*args: Any) -> Any:
        looks.append(args)
        return real(*args)

    monkeypatch.setattr(processes_module, "_status_and_bytes", counted)
    chunk = await pm.read(pid, cursor=end, wait_s=1.0)
    assert (chunk.data, chunk.ended) == (b"", False)
    # A wake-up at once would send the reader back to the files in a loop.
    assert len(looks) <= 3, f"the read looked at the files {len(looks)} times while waiting"
    await pm.kill(pid)


async def test_a_ready_host_that_died_is_replaced(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host kept ready ahead of time may be gone by the next start: another one serves it."""
    monkeypatch.setattr(_prochost_launch, "HOST_IDLE_S", 0.0)  # no idle host to reuse
    pm = pm_of(ws)
    assert await read_all(pm, await start(pm, "echo warm")) == b"warm\n"
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.close()  # stands for a ready host that died
    with PROCESS_HOSTS._ready_lock:
        kept, PROCESS_HOSTS._ready = PROCESS_HOSTS._ready, ours
    if kept is not None:
        kept.close()  # the real one sees EOF and exits
    assert await read_all(pm, await start(pm, "echo served")) == b"served\n"
    assert ours.fileno() == -1  # found dead and closed, not used


async def test_a_start_whose_record_fails_leaves_nothing_running(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host spawns before the record is written: without one, the command must not live on."""
    pm = pm_of(ws)
    assert ws.fs is not None

    def unwritable(*_args: Any) -> None:
        raise PermissionError(13, "denied")

    monkeypatch.setattr(processes_module.HostProcessManager, "_create_record", unwritable)
    with pytest.raises(PermissionError):
        await pm.start(
            ProcessRequest("sleep 0.5; echo leaked > leaked.txt", allow_shell_syntax=True)
        )
    monkeypatch.undo()
    await anyio.sleep(1.5)
    assert "leaked.txt" not in [e.name for e in await ws.fs.ls(".")]
    assert list(await pm.list()) == []


async def test_output_before_the_record_is_handed_over_is_kept(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the command writes while its record is still being written reaches the reader."""
    pm = pm_of(ws)
    real = processes_module.HostProcessManager._create_record

    def slow(*args: Any) -> None:
        import time

        time.sleep(0.3)  # the command has long printed (in a worker thread: no loop blocked)
        real(*args)

    monkeypatch.setattr(processes_module.HostProcessManager, "_create_record", slow)
    pid = await start(pm, "echo early; echo late >&2")
    assert await read_all(pm, pid) == b"early\n"
    assert await read_all(pm, pid, "stderr") == b"late\n"
    assert (await pm.wait(pid, timeout_s=10)).exit_code == 0


async def test_background_server_answers_on_loopback(ws: Workspace) -> None:
    pm = pm_of(ws)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert ws.fs is not None
    await ws.fs.write_file("index.html", b"served-by-background\n")
    pid = await start(pm, f"exec python3 -u -m http.server {port} --bind 127.0.0.1")
    await read_until(pm, pid, b"Serving HTTP")
    assert ws.shell is not None
    client = f"python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/index.html').read().decode())\""
    result = await ws.shell.run(CommandRequest(client, allow_shell_syntax=True, timeout_s=20))
    assert result.stdout == "served-by-background\n\n", result
    info = await pm.kill(pid)
    assert info.state == "killed"


async def test_python_repl_through_a_terminal(ws: Workspace) -> None:
    pm = pm_of(ws)
    # Without shell syntax the program leads the terminal's session itself, so
    # ^C reaches it alone (a `sh -c` in between would die of it, as it would
    # in any terminal).
    pid = (
        await pm.start(ProcessRequest("python3 -i -q", terminal=TerminalSize(cols=100, rows=30)))
    ).process_id
    cursor = await read_until(pm, pid, b">>> ")
    await pm.write_stdin(pid, b"import os; print(os.isatty(0), 6 * 7)\r")
    cursor = await read_until(pm, pid, b"True 42", cursor)
    mine = os.getsid(0)
    await pm.write_stdin(
        pid, f"print(os.getsid(0) != {mine}, os.tcgetpgrp(0) == os.getpgrp())\r".encode()
    )
    # A session of its own with the terminal as controlling tty, in the foreground.
    cursor = await read_until(pm, pid, b"True True\r\n>>> ", cursor)
    await pm.write_stdin(pid, b"import time; time.sleep(1000)\r")
    await anyio.sleep(0.2)
    await pm.write_stdin(pid, b"\x03")  # ^C: SIGINT to the foreground job only
    cursor = await read_until(pm, pid, b"KeyboardInterrupt\r\n>>> ", cursor)
    # (os._exit: CPython's REPL exits by SIGINT at EOF once it printed a KeyboardInterrupt.)
    await pm.write_stdin(pid, b"os._exit(7)\r")
    info = await pm.wait(pid, timeout_s=20)
    assert (info.state, info.exit_code) == ("exited", 7)
    assert info.stderr_end == 0  # a terminal has one stream

    pid = (await pm.start(ProcessRequest("python3 -i -q", terminal=TerminalSize()))).process_id
    await read_until(pm, pid, b">>> ")
    await pm.close_stdin(pid)  # ^D at the prompt
    info = await pm.wait(pid, timeout_s=20)
    assert (info.state, info.exit_code) == ("exited", 0)


async def test_full_screen_program_and_resize(ws: Workspace) -> None:
    pm = pm_of(ws)
    assert ws.fs is not None
    await ws.fs.write_file("long.txt", "".join(f"line {i}\n" for i in range(500)).encode())
    pid = await start(pm, "less long.txt", terminal=TerminalSize(cols=80, rows=10))
    cursor = await read_until(pm, pid, b"line 8")
    await pm.write_stdin(pid, b" ")  # next page
    cursor = await read_until(pm, pid, b"line 17", cursor)
    await pm.write_stdin(pid, b"q")
    assert (await pm.wait(pid, timeout_s=20)).state == "exited"

    script = textwrap.dedent(
        """
        import os, signal
        def winch(*_):
            c, r = os.get_terminal_size(0)
            os.write(1, f"size={c}x{r}\\n".encode())
        signal.signal(signal.SIGWINCH, winch)
        print("ready", flush=True)
        while True:
            signal.pause()
        """
    )
    await ws.fs.write_file("winch.py", script.encode())
    pid = await start(pm, "python3 winch.py", terminal=TerminalSize(cols=80, rows=24))
    cursor = await read_until(pm, pid, b"ready")
    await pm.resize(pid, TerminalSize(cols=132, rows=43))
    await read_until(pm, pid, b"size=132x43", cursor)
    assert (await pm.info(pid)).terminal == TerminalSize(cols=132, rows=43)
    await pm.kill(pid)


async def test_stdin_of_50_mib_arbitrary_bytes(ws: Workspace) -> None:
    pm = pm_of(ws)
    data = os.urandom(50 << 20) + b"\0\xff\0"
    pid = await start(pm, "sha256sum")
    for i in range(0, len(data), 7 << 20):
        await pm.write_stdin(pid, data[i : i + (7 << 20)])
    await pm.close_stdin(pid)
    assert (await pm.wait(pid, timeout_s=60)).exit_code == 0
    out = await read_all(pm, pid)
    assert out.split()[0].decode() == hashlib.sha256(data).hexdigest()
    with pytest.raises(OperationError) as exc:
        await pm.write_stdin(pid, b"late")
    assert exc.value.code == "closed"


async def test_gigabyte_stream_with_a_small_window(ws: Workspace, tmp_path: Path) -> None:
    import resource

    pm = pm_of(ws)
    window = 1 << 20
    pid = await start(pm, "head -c 1073741824 /dev/zero", retained_bytes=window)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cursor = got = skipped = expired = 0
    records = next(tmp_path.glob("corral-proc-test-*/state/ws-*/processes"))
    out_dir = next(records.glob("*/stdout"))
    peak_disk = 0
    while True:
        try:
            chunk = await pm.read(pid, cursor=cursor, max_bytes=256 << 10, wait_s=10)
        except CursorExpiredError as exc:
            earliest, code = exc.earliest, exc.code
        else:
            earliest, code = -1, None
        if code is not None:
            assert code == "cursor_expired"
            assert earliest > cursor
            skipped += earliest - cursor
            expired += 1
            cursor = earliest
            continue
        assert chunk.data.count(0) == len(chunk.data)
        got += len(chunk.data)
        cursor = chunk.next_cursor
        if expired % 16 == 0:
            peak_disk = max(peak_disk, disk_use(out_dir))
        if chunk.ended:
            break
    assert cursor == got + skipped == 1 << 30
    assert expired > 0  # the window really moved on under a slow reader
    assert peak_disk <= window + segment_size(window)  # see the flood test
    assert disk_use(out_dir) <= window
    info = await pm.info(pid)
    assert info.stdout_end == 1 << 30
    assert (1 << 30) - info.stdout_start <= window
    # Memory flat: nothing near the stream's size was ever held.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 200 << 10


async def test_output_flood_stays_within_the_window_on_disk(ws: Workspace, tmp_path: Path) -> None:
    pm = pm_of(ws)
    window = 64 << 10
    pid = await start(pm, "yes flood", retained_bytes=window)
    out_dir = next(tmp_path.glob(f"corral-proc-test-*/state/ws-*/processes/{pid}/stdout"))
    for _ in range(50):
        await anyio.sleep(0.02)
        # Listing and sizes are not one snapshot: the newest segment may grow
        # between them, so a live measurement can overshoot by one segment.
        assert disk_use(out_dir) <= window + segment_size(window)
    info = await pm.kill(pid)
    assert disk_use(out_dir) <= window  # at rest, exact
    assert info.stdout_end > 10 * window
    assert info.stdout_end - info.stdout_start <= window
    with pytest.raises(CursorExpiredError) as exc:
        await pm.read(pid, cursor=0)
    assert exc.value.earliest == info.stdout_start


async def test_kill_takes_setsid_and_double_forked_children(ws: Workspace) -> None:
    pm = pm_of(ws)
    pid = await start(
        pm,
        "setsid sh -c 'sleep 1000 & echo $!' ; (sh -c 'sleep 1000 & echo $!' &) ; sleep 1000",
    )
    seen = b""
    cursor = 0
    while seen.count(b"\n") < 2:
        chunk = await pm.read(pid, cursor=cursor, wait_s=10)
        seen += chunk.data
        cursor = chunk.next_cursor
    escaped = [int(x) for x in seen.split()]
    assert all(alive(p) for p in escaped)
    info = await pm.kill(pid)
    assert info.state == "killed"
    assert info.signal == signal.SIGKILL
    for p in escaped:
        assert await gone(p)


async def test_timeout_kills_the_tree(ws: Workspace) -> None:
    pm = pm_of(ws)
    pid = await start(pm, "echo $$; sleep 1000", timeout_s=0.3)
    info = await pm.wait(pid, timeout_s=30)
    assert (info.state, info.reason) == ("killed", "timeout")


async def test_signal_reaches_the_process(ws: Workspace) -> None:
    pm = pm_of(ws)
    pid = await start(
        pm, "trap 'echo got-term; exit 5' TERM; echo ready; while :; do sleep 0.05; done"
    )
    await read_until(pm, pid, b"ready")
    await pm.signal(pid, signal.SIGTERM)
    info = await pm.wait(pid, timeout_s=20)
    assert (info.state, info.exit_code) == ("exited", 5)


async def test_another_program_signals_and_kills_but_cannot_type(tmp_path: Path) -> None:
    """A resolve elsewhere reaches the process host (whole tree); input stays with its owner."""
    provider = ProcProvider(tmpdir_root=str(tmp_path))
    opened = await provider.open(corral.ProviderConfig("proc-test"), corral.SessionRef("t"))
    other = await ProcProvider(tmpdir_root=str(tmp_path)).resolve(opened.ref)
    try:
        pm, theirs = pm_of(opened.workspace), pm_of(other)
        trapped = await start(
            pm, "trap 'echo got-term; exit 5' TERM; echo ready; while :; do sleep 0.05; done"
        )
        tree = await start(
            pm,
            "setsid sh -c 'sleep 1000 & echo $!' ; (sh -c 'sleep 1000 & echo $!' &) ; sleep 1000",
        )
        await read_until(pm, trapped, b"ready")
        seen, cursor = b"", 0
        while seen.count(b"\n") < 2:
            chunk = await theirs.read(tree, cursor=cursor, wait_s=10)
            seen, cursor = seen + chunk.data, chunk.next_cursor
        escaped = [int(x) for x in seen.split()]
        await theirs.signal(trapped, signal.SIGTERM)
        info = await theirs.wait(trapped, timeout_s=20)
        assert (info.state, info.exit_code) == ("exited", 5)
        for call in (theirs.write_stdin(tree, b"x"), theirs.close_stdin(tree)):
            with pytest.raises(OperationError) as exc:
                await call
            assert exc.value.code == "busy"
            assert "belong to the program that started it" in str(exc.value)
        info = await theirs.kill(tree)
        assert (info.state, info.signal) == ("killed", signal.SIGKILL)
        for p in escaped:
            assert await gone(p)
        assert (await pm.info(tree)).state == "killed"
        assert await theirs.kill(tree) == info  # idempotent from there too
    finally:
        await other.close()
        await opened.workspace.close()


async def test_closing_the_workspace_kills_every_process(tmp_path: Path) -> None:
    provider = ProcProvider(tmpdir_root=str(tmp_path))
    opened = await provider.open(corral.ProviderConfig("proc-test"), corral.SessionRef("t"))
    pm = pm_of(opened.workspace)
    pids = []
    for _ in range(3):
        pid = await start(pm, "(setsid sleep 1000 &) ; echo $$; sleep 1000")
        chunk = await pm.read(pid, cursor=0, wait_s=10)
        pids.append(int(chunk.data))
    children = [c for p in pids for c in _descendants_of_host(p)]
    await opened.workspace.close()
    for p in pids + children:
        assert await gone(p)
    with pytest.raises(OperationError) as exc:
        await pm.list()
    assert exc.value.code == "closed"


def _descendants_of_host(pid: int) -> list[int]:
    """Processes whose parent is the given one's parent (its siblings: the escaped sleeps)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
    try:
        with open(f"/proc/{ppid}/task/{ppid}/children", "rb") as f:
            return [int(x) for x in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):  # gone, or gone between open and read
        return []


async def test_workspaces_do_not_see_each_others_processes(tmp_path: Path) -> None:
    provider = ProcProvider(tmpdir_root=str(tmp_path))
    a = await provider.open(corral.ProviderConfig("proc-test"), corral.SessionRef("a"))
    b = await provider.open(corral.ProviderConfig("proc-test"), corral.SessionRef("b"))
    try:
        pid = await start(pm_of(a.workspace), "sleep 1000")
        assert [i.process_id for i in await pm_of(a.workspace).list()] == [pid]
        assert await pm_of(b.workspace).list() == []
        for call in (pm_of(b.workspace).info(pid), pm_of(b.workspace).kill(pid)):
            with pytest.raises(OperationError) as exc:
                await call
            assert exc.value.code == "not_found"
        with pytest.raises(OperationError) as exc:
            await pm_of(b.workspace).read("../../x")
        assert exc.value.code == "not_found"
    finally:
        await a.workspace.close()
        await b.workspace.close()


async def test_bad_arguments_are_refused(ws: Workspace) -> None:
    pm = pm_of(ws)
    pid = await start(pm, "echo hi")
    for kwargs in ({"cursor": -1}, {"max_bytes": 0}, {"wait_s": -1.0}):
        with pytest.raises(OperationError) as exc:
            await pm.read(pid, **kwargs)  # type: ignore[arg-type]
        assert exc.value.code == "invalid_argument"
    with pytest.raises(OperationError) as exc:
        await pm.resize(pid, TerminalSize())
    assert exc.value.code == "invalid_argument"
    with pytest.raises(OperationError) as exc:
        await pm.start(ProcessRequest("echo", retained_bytes=0))
    assert exc.value.code == "invalid_argument"
    sleeper = await start(pm, "sleep 1000")
    with pytest.raises(OperationError) as exc:
        await pm.remove(sleeper)
    assert exc.value.code == "invalid_argument"
    await pm.kill(sleeper)
    await pm.remove(sleeper)
    assert [i.process_id for i in await pm.list()] == [pid]


_CRASHER = """
import anyio, json, sys
import corral
from corral.provider import ProcessRequest
from corral_posix import TmpdirWorkspaceProvider

class ProcProvider(TmpdirWorkspaceProvider):
    provider_id = "proc-test"
    capabilities = frozenset({{"fs", "shell", "process"}})

async def main():
    provider = ProcProvider(tmpdir_root={root!r})
    opened = await provider.open(corral.ProviderConfig("proc-test"), corral.SessionRef("c"))
    pm = opened.workspace.module("process")
    done = await pm.start(ProcessRequest("echo finished", allow_shell_syntax=True))
    await pm.wait(done.process_id, timeout_s=10)
    info = await pm.start(ProcessRequest(
        "echo recorded; (setsid sleep 1000 &); echo $$; sleep 1000", allow_shell_syntax=True))
    seen = b""
    while seen.count(b"\\n") < 2:
        seen = (await pm.read(info.process_id, cursor=0, wait_s=10)).data
    ref = opened.ref
    report = {{"payload": dict(ref.payload), "caps": sorted(ref.capabilities),
              "version": ref.schema_version, "pid": int(seen.split()[1])}}
    print(json.dumps(report), flush=True)
    await anyio.sleep(1000)

anyio.run(main)
"""


async def test_host_program_crash_leaves_lost_handles_with_their_output(tmp_path: Path) -> None:
    code = _CRASHER.format(root=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, env={**os.environ}
    )
    try:
        assert proc.stdout is not None
        line = await anyio.to_thread.run_sync(proc.stdout.readline)
        report = json.loads(line)
        shell_pid = report["pid"]
        siblings = _descendants_of_host(shell_pid)
        assert alive(shell_pid)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    # No orphan outlives the program that started them.
    for p in [shell_pid, *siblings]:
        assert await gone(p)
    ref = corral.provider.WorkspaceRef(
        provider_id="proc-test",
        payload=report["payload"],
        capabilities=frozenset(report["caps"]),
        schema_version=report["version"],
    )
    fresh = ProcProvider(tmpdir_root=str(tmp_path))
    ws = await fresh.resolve(ref)
    try:
        pm = pm_of(ws)
        infos = await pm.list()
        for _ in range(500):  # its process host may still be recording the end
            if infos[1].state != "running":
                break
            await anyio.sleep(0.01)
            infos = await pm.list()
        assert [i.state for i in infos] == ["exited", "lost"]
        assert infos[1].reason
        assert await read_all(pm, infos[0].process_id) == b"finished\n"
        recorded = await read_all(pm, infos[1].process_id)
        assert recorded.startswith(b"recorded\n")
        with pytest.raises(OperationError):
            await pm.write_stdin(infos[1].process_id, b"x")
    finally:
        await ws.close()


async def test_a_killed_process_host_takes_its_tree_and_reads_as_lost(ws: Workspace) -> None:
    pm = pm_of(ws)
    pid = await start(pm, "echo $$; (setsid sleep 1000 &) ; sleep 1000")
    shell_pid = int((await pm.read(pid, cursor=0, wait_s=10)).data)
    with open(f"/proc/{shell_pid}/stat", "rb") as f:
        host = int(f.read().rsplit(b")", 1)[1].split()[1])
    siblings = _descendants_of_host(shell_pid)
    os.kill(host, signal.SIGKILL)
    for p in [shell_pid, *siblings]:
        assert await gone(p)  # orphans land on the server, which kills them
    info = await pm.wait(pid, timeout_s=10)
    assert info.state == "lost"
    assert info.stdout_end == len(f"{shell_pid}\n")
    chunk = await pm.read(pid, cursor=0)
    assert chunk.ended
