"""The ``process`` module (where advertised): byte cursors, lifetimes, terminals.

Commands are POSIX ``sh`` lines using only what busybox has (``seq``,
``head``, ``sleep``, ``stty``), so the rules run on every provider's
minimal image; each request turns shell syntax on, because these rules
check the process module, not the command guard the shell rules check.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import anyio
import anyio.to_thread
import hypothesis
import pytest
from hypothesis import strategies as st

from corral import OperationError
from corral.provider import (
    CursorExpiredError,
    ProcessInfo,
    ProcessManager,
    ProcessRequest,
    StreamName,
    TerminalSize,
)

from ._harness import Harness
from ._rules import define, rule

__all__ = ["AbstractProcessTests"]

_P = "ProcessManager"
RANGE = define(
    "process.read.range",
    "StreamChunk",
    "A read returns the bytes at [cursor, next_cursor) of the stream: next_cursor is cursor "
    "plus the bytes returned, never more than max_bytes.",
)
RESUME = define(
    "process.read.resume",
    "corral._process",
    "A reader that resumes from the next_cursor it was given never sees a byte twice and never "
    "skips one, whatever the read sizes and whether the process is still writing.",
)
EXPIRED = define(
    "process.read.expired",
    f"{_P}.read",
    "A stream keeps at most retained_bytes and at least the most recent half of them; a cursor "
    "older than the retained window is CursorExpiredError naming the earliest cursor still "
    "available (info's stdout_start), and reading from that cursor returns the stream's bytes "
    "from there.",
)
BEYOND = define(
    "process.read.beyond_end",
    f"{_P}.read",
    "Reading an ended stream at its end returns nothing with ended=True; beyond its end is "
    "invalid_argument, as are a negative cursor and max_bytes below 1.",
)
WAIT = define(
    "process.read.wait",
    f"{_P}.read",
    "With no byte at the cursor, a read waits up to wait_s for one and returns as soon as it "
    "arrives; when none does it returns nothing, not ended.",
)
EXIT = define(
    "process.exit.codes",
    f"{_P}.start",
    "A process that exits by itself is exited with its exit code; a program that does not exist "
    "exits 127 and one that cannot be executed 126, not an exception.",
)
STDIN = define(
    "process.stdin",
    f"{_P}.write_stdin",
    "Bytes written to stdin reach the process in order; close_stdin sends end of file; writing "
    "after that is 'closed'.",
)
KILL_TREE = define(
    "process.kill.tree",
    f"{_P}.kill",
    "kill ends the process and its whole tree (children that went to the background, a new "
    "session or a double fork included) and returns the final info, state killed.",
)
TIMEOUT = define(
    "process.timeout",
    "ProcessRequest.timeout_s",
    "A process still running at its timeout_s is killed with its tree (state killed, "
    "reason 'timeout': streamed results report timed_out from it).",
)
WAIT_END = define(
    "process.wait",
    f"{_P}.wait",
    "wait returns the info once the process ended, or after timeout_s with the process still "
    "running.",
)
REGISTRY = define(
    "process.handles",
    f"{_P}.list",
    "list holds every process of the workspace oldest first, info matches it, an unknown id is "
    "not_found, remove refuses a running process (invalid_argument) and forgets an ended one.",
)
ISOLATION = define(
    "process.isolation",
    _P,
    "Processes belong to their workspace: another workspace does not list them and their ids "
    "are not_found there.",
)
CLOSED = define(
    "process.closed",
    _P,
    "Every method raises 'closed' after the workspace closed.",
)
CLOSE_KILLS = define(
    "process.close.kills",
    "ProcessManager",
    "Closing the workspace kills every one of its processes, with their trees (checked in "
    "/proc where they are visible from the host).",
)
PTY = define(
    "process.pty",
    "ProcessRequest.terminal",
    "Under a terminal, input is echoed as a terminal does, the program sees the terminal's size "
    "(stty size), and resize changes what it sees; stderr is empty and ended.",
)

_MAX_READS: Final = 200
"""Reads per drawn example (1-byte reads of a whole stream would take too long)."""
_WAIT: Final = 30.0
"""Longest a rule waits for something that should take milliseconds."""


def _with_marker(mark: bytes) -> list[int]:
    """Host pids whose command line holds ``mark`` (blocking: run in a thread)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if mark in f.read():
                    found.append(int(entry))
        except OSError:
            continue  # ended meanwhile, or not ours to read
    return found


async def _marked(mark: bytes, *, present: bool) -> list[int]:
    """Poll /proc until processes with ``mark`` are (or are no longer) there, for a while."""
    found: list[int] = []
    with anyio.move_on_after(_WAIT / 3):
        while True:
            found = await anyio.to_thread.run_sync(_with_marker, mark)
            if bool(found) == present:
                break
            await anyio.sleep(0.1)
    return found


def _manager(opened: Any) -> ProcessManager:
    module = opened.workspace.module("process")
    assert module is not None
    return module  # type: ignore[no-any-return]


@asynccontextmanager
async def _processes(h: Harness) -> AsyncIterator[ProcessManager]:
    h.require("process")
    async with h.session("process") as opened:
        yield _manager(opened)


async def _start(h: Harness, pm: ProcessManager, command: str, **kw: Any) -> ProcessInfo:
    return await h.call(pm.start, ProcessRequest(command, allow_shell_syntax=True, **kw))


async def _read_all(
    h: Harness,
    pm: ProcessManager,
    pid: str,
    stream: StreamName = "stdout",
    *,
    max_bytes: int = 1 << 16,
) -> bytes:
    """The whole stream from cursor 0 to its end (waiting for the end)."""
    out = bytearray()
    cursor = 0
    while True:
        chunk = await h.call(pm.read, pid, stream, cursor=cursor, max_bytes=max_bytes, wait_s=1.0)
        out += chunk.data
        cursor = chunk.next_cursor
        if chunk.ended:
            return bytes(out)


async def _finished(h: Harness, pm: ProcessManager, pid: str) -> ProcessInfo:
    info = await h.call(pm.wait, pid, timeout_s=_WAIT)
    assert info.state != "running", f"{h.kind}: a short process still runs after {_WAIT}s"
    return info


def _seq(n: int) -> bytes:
    return "".join(f"{i}\n" for i in range(1, n + 1)).encode()


async def _until(
    h: Harness, pm: ProcessManager, pid: str, needle: bytes, cursor: int = 0
) -> tuple[bytes, int]:
    """Read stdout from ``cursor`` until ``needle`` shows up; return what was read and the end."""
    seen = bytearray()
    with anyio.move_on_after(_WAIT):
        while needle not in seen:
            chunk = await h.call(pm.read, pid, "stdout", cursor=cursor, wait_s=1.0)
            seen += chunk.data
            cursor = chunk.next_cursor
            if chunk.ended:
                break
    return bytes(seen), cursor


class AbstractProcessTests:
    """The ``process`` rules for providers that advertise it."""

    @rule(RANGE, RESUME)
    @pytest.mark.anyio
    async def test_process_cursor_reads_are_exact(self, conformance: Harness) -> None:
        """Random read sizes from random cursors return exactly the stream's bytes."""
        h = conformance
        async with _processes(h) as pm:
            info = await _start(h, pm, "seq 1 2000")
            expected = _seq(2000)
            await _finished(h, pm, info.process_id)
            pid = info.process_id

            @h.settings()
            @hypothesis.given(
                start=st.integers(0, len(expected)),
                sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=30),
            )
            def reads(start: int, sizes: list[int]) -> None:
                cursor, got = start, bytearray()
                for i in range(_MAX_READS):
                    size = sizes[i % len(sizes)]
                    chunk = h.blocking(pm.read, pid, "stdout", cursor=cursor, max_bytes=size)
                    assert chunk.cursor == cursor, "the chunk does not start at the cursor"
                    assert len(chunk.data) <= size, "more bytes than max_bytes"
                    assert chunk.next_cursor == cursor + len(chunk.data), (
                        f"next_cursor {chunk.next_cursor} is not cursor {cursor} + "
                        f"{len(chunk.data)} bytes"
                    )
                    assert chunk.data == expected[cursor : chunk.next_cursor], (
                        f"bytes at [{cursor}, {chunk.next_cursor}) differ from the stream's"
                    )
                    got += chunk.data
                    cursor = chunk.next_cursor
                    if chunk.ended:
                        assert cursor == len(expected), f"ended at {cursor}, before the end"
                        break
                assert bytes(got) == expected[start:cursor], "resuming lost or repeated bytes"

            await h.in_thread(reads)

    @rule(RESUME)
    @pytest.mark.anyio
    async def test_process_live_reads_lose_nothing(self, conformance: Harness) -> None:
        """Small reads racing a process that is still writing rebuild its output exactly."""
        h = conformance
        async with _processes(h) as pm:
            info = await _start(
                h,
                pm,
                "for i in $(seq 1 300); do echo line-$i; [ $((i % 50)) = 0 ] && sleep 0.05; done",
            )
            got = await _read_all(h, pm, info.process_id, max_bytes=7)
            want = "".join(f"line-{i}\n" for i in range(1, 301)).encode()
            assert got == want, "reading while the process writes lost or repeated bytes"

    @rule(EXPIRED)
    @pytest.mark.anyio
    async def test_process_expired_cursor_names_the_earliest(self, conformance: Harness) -> None:
        """Output beyond the retained window expires; the error names where reading can resume."""
        h = conformance
        async with _processes(h) as pm:
            info = await _start(h, pm, "seq 1 40000", retained_bytes=4096)
            expected = _seq(40000)
            info = await _finished(h, pm, info.process_id)
            pid = info.process_id
            assert info.stdout_end == len(expected), "stdout_end is not the bytes produced"
            earliest = info.stdout_start
            assert earliest > 0, "nothing expired although the output is 60x the window"
            kept = info.stdout_end - earliest
            assert 2048 <= kept <= 4096, f"{kept} bytes kept of a 4096-byte window"
            with pytest.raises(CursorExpiredError) as caught:
                await h.call(pm.read, pid, "stdout", cursor=0)
            assert caught.value.earliest == earliest, (
                f"the error names {caught.value.earliest}, info says {earliest}"
            )
            assert caught.value.code == "cursor_expired"
            with pytest.raises(CursorExpiredError):
                await h.call(pm.read, pid, "stdout", cursor=earliest - 1)
            chunk = await h.call(pm.read, pid, "stdout", cursor=earliest, max_bytes=1 << 20)
            assert chunk.data == expected[earliest : chunk.next_cursor], (
                "the bytes at the earliest cursor are not the stream's"
            )

    @rule(BEYOND)
    @pytest.mark.anyio
    async def test_process_reads_past_the_end_are_invalid(self, conformance: Harness) -> None:
        """At the end: empty and ended. Past it, or with bad numbers: invalid_argument."""
        h = conformance
        async with _processes(h) as pm:
            info = await _start(h, pm, "echo hi")
            info = await _finished(h, pm, info.process_id)
            pid = info.process_id
            end = await h.call(pm.read, pid, "stdout", cursor=3)
            assert (end.data, end.next_cursor, end.ended) == (b"", 3, True), end
            for kwargs in ({"cursor": 4}, {"cursor": -1}, {"max_bytes": 0}, {"wait_s": -1.0}):
                with pytest.raises(OperationError) as caught:
                    await h.call(pm.read, pid, "stdout", **kwargs)
                assert caught.value.code == "invalid_argument", (kwargs, caught.value.code)

    @rule(WAIT)
    @pytest.mark.anyio
    async def test_process_read_waits_for_output(self, conformance: Harness) -> None:
        """A waiting read ends when bytes arrive; a silent process gives an empty chunk."""
        h = conformance
        async with _processes(h) as pm:
            silent = await _start(h, pm, "sleep 300")
            chunk = await h.call(pm.read, silent.process_id, "stdout", wait_s=0.2)
            assert (chunk.data, chunk.ended) == (b"", False), chunk
            late = await _start(h, pm, "sleep 0.3; echo late")
            began = time.monotonic()
            chunk = await h.call(pm.read, late.process_id, "stdout", wait_s=_WAIT)
            assert chunk.data == b"late\n", chunk
            assert time.monotonic() - began < _WAIT - 5, "the read waited out wait_s"

    @rule(EXIT)
    @pytest.mark.anyio
    async def test_process_exit_codes(self, conformance: Harness) -> None:
        """Own exit codes; 127 for a missing program; 126 for a file that is not executable."""
        h = conformance
        async with _processes(h) as pm:
            info = await _finished(h, pm, (await _start(h, pm, "echo out; exit 3")).process_id)
            assert (info.state, info.exit_code) == ("exited", 3), info
            assert info.ended_at is not None
            missing = await h.call(
                pm.start, ProcessRequest(f"no-such-program-{secrets.token_hex(4)}")
            )
            info = await _finished(h, pm, missing.process_id)
            assert info.exit_code == 127, f"a missing program exited {info.exit_code}"
            made = await _start(h, pm, "printf 'echo hi\\n' > not-executable.sh")
            await _finished(h, pm, made.process_id)
            denied = await h.call(pm.start, ProcessRequest("./not-executable.sh"))
            info = await _finished(h, pm, denied.process_id)
            assert info.exit_code == 126, f"a non-executable file exited {info.exit_code}"

    @rule(STDIN)
    @pytest.mark.anyio
    async def test_process_stdin_reaches_the_process(self, conformance: Harness) -> None:
        """What is written comes back from cat in order; EOF ends it; later writes are closed."""
        h = conformance
        async with _processes(h) as pm:
            info = await _start(h, pm, "cat")
            data = bytes(range(256)) * 64 + b"end\n"
            for i in range(0, len(data), 3000):
                await h.call(pm.write_stdin, info.process_id, data[i : i + 3000])
            await h.call(pm.close_stdin, info.process_id)
            assert await _read_all(h, pm, info.process_id) == data, "stdin bytes changed"
            final = await _finished(h, pm, info.process_id)
            assert final.exit_code == 0
            with pytest.raises(OperationError) as caught:
                await h.call(pm.write_stdin, info.process_id, b"more")
            assert caught.value.code == "closed"

    @rule(KILL_TREE)
    @pytest.mark.anyio
    async def test_process_kill_kills_the_tree(self, conformance: Harness) -> None:
        """Background, setsid and double-forked children stop writing once the handle is killed."""
        h = conformance
        async with _processes(h) as pm:
            tick = "while :; do echo x >> {f}; sleep 0.05; done"
            command = (
                f"({tick.format(f='bg.tick')}) & "
                f"( ({tick.format(f='orphan.tick')}) & ) ; "
                f"(command -v setsid >/dev/null && setsid sh -c '{tick.format(f='sid.tick')}' &) ; "
                "echo started; sleep 300"
            )
            info = await _start(h, pm, command)
            _seen, _ = await _until(h, pm, info.process_id, b"started")
            await anyio.sleep(0.3)
            final = await h.call(pm.kill, info.process_id)
            assert final.state == "killed", f"state after kill: {final.state}"
            again = await h.call(pm.kill, info.process_id)
            assert again.state == "killed", "kill is not idempotent"
            size = "for f in *.tick; do wc -c < $f; done"
            first = await _finished(h, pm, (await _start(h, pm, size)).process_id)
            before = await _read_all(h, pm, first.process_id)
            await anyio.sleep(0.5)
            second = await _finished(h, pm, (await _start(h, pm, size)).process_id)
            after = await _read_all(h, pm, second.process_id)
            assert before == after, (
                "children of a killed process are still writing "
                f"(tick file sizes {before.split()} then {after.split()})"
            )

    @rule(TIMEOUT)
    @pytest.mark.anyio
    async def test_process_timeout_kills_it(self, conformance: Harness) -> None:
        """A process past its timeout_s is killed, and says it was the timeout."""
        h = conformance
        async with _processes(h) as pm:
            info = await _start(h, pm, "sleep 300", timeout_s=0.3)
            final = await _finished(h, pm, info.process_id)
            assert final.state == "killed", f"state after the timeout: {final.state}"
            # The streamed run results' timed_out is read from this exact value.
            assert final.reason == "timeout", f"reason after the timeout: {final.reason!r}"

    @rule(WAIT_END)
    @pytest.mark.anyio
    async def test_process_wait_returns_either_way(self, conformance: Harness) -> None:
        """wait gives up at its timeout with the process running, and returns early at its end."""
        h = conformance
        async with _processes(h) as pm:
            info = await _start(h, pm, "sleep 300")
            still = await h.call(pm.wait, info.process_id, timeout_s=0.2)
            assert still.state == "running", still
            quick = await _start(h, pm, "exit 0")
            began = time.monotonic()
            done = await h.call(pm.wait, quick.process_id, timeout_s=_WAIT)
            assert done.state == "exited", done
            assert time.monotonic() - began < _WAIT - 5, "wait waited out its timeout"

    @rule(REGISTRY)
    @pytest.mark.anyio
    async def test_process_list_info_remove(self, conformance: Harness) -> None:
        """Handles are listed oldest first, looked up, refused while running, forgotten after."""
        h = conformance
        async with _processes(h) as pm:
            first = await _start(h, pm, "echo one")
            second = await _start(h, pm, "sleep 300")
            listed = [p.process_id for p in await h.call(pm.list)]
            assert listed == [first.process_id, second.process_id], listed
            assert first.process_id != second.process_id
            info = await h.call(pm.info, second.process_id)
            assert (info.process_id, info.command, info.state) == (
                second.process_id,
                "sleep 300",
                "running",
            )
            with pytest.raises(OperationError) as caught:
                await h.call(pm.info, "no-such-process")
            assert caught.value.code == "not_found"
            with pytest.raises(OperationError) as caught:
                await h.call(pm.remove, second.process_id)
            assert caught.value.code == "invalid_argument"
            await _finished(h, pm, first.process_id)
            await h.call(pm.remove, first.process_id)
            with pytest.raises(OperationError) as caught:
                await h.call(pm.info, first.process_id)
            assert caught.value.code == "not_found"
            assert [p.process_id for p in await h.call(pm.list)] == [second.process_id]

    @rule(ISOLATION)
    @pytest.mark.anyio
    async def test_process_handles_stay_in_their_workspace(self, conformance: Harness) -> None:
        """Another session's workspace neither lists nor reads this one's processes."""
        h = conformance
        async with _processes(h) as pm_a, h.session("process") as other:
            pm_b = _manager(other)
            info = await _start(h, pm_a, "echo mine; sleep 300")
            assert info.process_id not in [p.process_id for p in await h.call(pm_b.list)]
            for call in (pm_b.info, pm_b.kill):
                with pytest.raises(OperationError) as caught:
                    await h.call(call, info.process_id)
                assert caught.value.code == "not_found", caught.value.code
            with pytest.raises(OperationError) as caught:
                await h.call(pm_b.read, info.process_id, "stdout")
            assert caught.value.code == "not_found"
            assert (await h.call(pm_a.info, info.process_id)).state == "running"

    @rule(CLOSED)
    @pytest.mark.anyio
    async def test_process_module_is_closed_after_close(self, conformance: Harness) -> None:
        """After the workspace closed, every method says closed."""
        h = conformance
        h.require("process")
        opened = await h.open(frozenset({"process"}))
        pm = _manager(opened)
        info = await _start(h, pm, "sleep 300")
        await h.call(opened.workspace.close)
        pid = info.process_id
        calls: list[tuple[str, Any]] = [
            ("start", lambda: pm.start(ProcessRequest("echo hi"))),
            ("read", lambda: pm.read(pid, "stdout")),
            ("write_stdin", lambda: pm.write_stdin(pid, b"x")),
            ("wait", lambda: pm.wait(pid, timeout_s=0.1)),
            ("kill", lambda: pm.kill(pid)),
            ("info", lambda: pm.info(pid)),
            ("list", pm.list),
        ]
        for name, call in calls:
            with pytest.raises(OperationError) as caught:
                await h.call(call)
            assert caught.value.code == "closed", f"{name} after close: {caught.value.code}"

    @rule(CLOSE_KILLS)
    @pytest.mark.anyio
    async def test_process_closing_the_workspace_kills_them(self, conformance: Harness) -> None:
        """No process of a closed workspace is left on the host."""
        h = conformance
        h.require("process")
        if not await anyio.to_thread.run_sync(os.path.isdir, "/proc/self"):
            pytest.skip("no /proc on this host")
        mark = f"corral-close-{secrets.token_hex(6)}"
        opened = await h.open(frozenset({"process"}))
        try:
            pm = _manager(opened)
            await _start(h, pm, f"sleep 300; : {mark}")
            await _start(h, pm, f"(sleep 300; : {mark}) & sleep 300; : {mark}")
            if not await _marked(mark.encode(), present=True):
                pytest.skip(f"provider {h.kind}'s processes are not visible in this host's /proc")
        finally:
            with anyio.CancelScope(shield=True):
                await h.call(opened.workspace.close)
        left = await _marked(mark.encode(), present=False)
        assert not left, f"{len(left)} processes of the closed workspace still run"

    @rule(PTY)
    @pytest.mark.anyio
    async def test_process_terminal_echo_and_size(self, conformance: Harness) -> None:
        """A terminal echoes input, reports its size to stty and sees a resize."""
        h = conformance
        async with _processes(h) as pm:
            try:
                info = await h.call(
                    pm.start,
                    ProcessRequest("sh", terminal=TerminalSize(cols=77, rows=21)),
                )
            except OperationError as exc:
                if exc.code == "unsupported":
                    pytest.skip(f"provider {h.kind} has no terminals")
                raise
            pid = info.process_id
            assert info.terminal == TerminalSize(77, 21)
            mark = secrets.token_hex(4)
            # The shell prints done-2-MARK only after stty; the echoed input has $((1+1)).
            done = f"done-2-{mark}".encode()
            line = f"echo typed-{mark}; stty size; echo done-$((1+1))-{mark}\n"
            await h.call(pm.write_stdin, pid, line.encode())
            seen, cursor = await _until(h, pm, pid, done)
            assert f"echo typed-{mark}".encode() in seen, "the terminal did not echo the input"
            assert b"21 77" in seen, f"stty size did not report 21 77: {seen[-200:]!r}"
            await h.call(pm.resize, pid, TerminalSize(cols=100, rows=30))
            await h.call(pm.write_stdin, pid, line.replace("typed", "again").encode())
            seen, _ = await _until(h, pm, pid, done, cursor)
            assert b"30 100" in seen, f"stty size did not see the resize: {seen[-200:]!r}"
            assert (await h.call(pm.info, pid)).terminal == TerminalSize(100, 30)
            err = await h.call(pm.read, pid, "stderr")
            assert (err.data, err.ended) == (b"", True), "a terminal's stderr is not empty/ended"
            plain = await _start(h, pm, "sleep 300")
            with pytest.raises(OperationError) as caught:
                await h.call(pm.resize, plain.process_id, TerminalSize())
            assert caught.value.code == "invalid_argument"
