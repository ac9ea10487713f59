"""A scripted, in-memory ProcessManager for the process tools' unit tests.

It runs nothing: a test makes output appear (``emit``) and processes end
(``finish``). Its cursor arithmetic follows the protocol exactly (a bounded
retained window, ``cursor_expired`` naming the earliest cursor, waits that
end on new bytes or on the stream's end), so the tool layer is tested
against the contract, not against a lenient stand-in. Two conveniences:
``echo WORDS`` prints its words and exits 0; ``warn`` writes to stderr
only and keeps running; ``cat`` (and any command under
a terminal) echoes its input to stdout as a terminal would.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import anyio
import attrs

from corral import OperationError
from corral.provider import (
    CursorExpiredError,
    ProcessInfo,
    ProcessRequest,
    StreamChunk,
    StreamName,
    TerminalSize,
)


class _Stream:
    def __init__(self, retained: int) -> None:
        self.retained = retained
        self.data = bytearray()
        self.start = 0  # offset of data[0]
        self.ended = False

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def append(self, data: bytes) -> None:
        self.data += data
        excess = len(self.data) - self.retained
        if excess > 0:
            del self.data[:excess]
            self.start += excess


class _Proc:
    def __init__(self, pid: str, request: ProcessRequest) -> None:
        self.pid = pid
        self.request = request
        self.streams = {
            "stdout": _Stream(request.retained_bytes),
            "stderr": _Stream(request.retained_bytes),
        }
        self.info = ProcessInfo(
            process_id=pid,
            command=request.command,
            state="running",
            started_at=time.time(),
            terminal=request.terminal,
            stdin_open=True,
        )
        self.changed = anyio.Event()
        if request.terminal is not None:
            self.streams["stderr"].ended = True

    def poke(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


class FakeProcessManager:
    """See the module docstring; ``calls`` records every method called."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.requests: list[ProcessRequest] = []
        self.written: list[bytes] = []
        self._procs: dict[str, _Proc] = {}
        self._next = 0

    def _get(self, pid: str) -> _Proc:
        proc = self._procs.get(pid)
        if proc is None:
            raise OperationError("no such process", code="not_found")
        return proc

    def emit(self, pid: str, stream: StreamName, data: bytes) -> None:
        proc = self._get(pid)
        assert not proc.streams[stream].ended
        proc.streams[stream].append(data)
        proc.poke()

    def finish(self, pid: str, exit_code: int | None = 0, *, state: str = "exited") -> None:
        proc = self._get(pid)
        for s in proc.streams.values():
            s.ended = True
        proc.info = attrs.evolve(
            proc.info,
            state=state,  # type: ignore[arg-type]
            exit_code=exit_code,
            signal=None if exit_code is not None else 9,
            ended_at=time.time(),
            stdin_open=False,
        )
        proc.poke()

    async def start(self, request: ProcessRequest) -> ProcessInfo:
        self.calls.append("start")
        self.requests.append(request)
        self._next += 1
        pid = f"p{self._next}"
        self._procs[pid] = _Proc(pid, request)
        if request.command.startswith("echo "):
            self.emit(pid, "stdout", request.command[5:].encode() + b"\n")
            self.finish(pid, 0)
        elif request.command == "warn":  # a server that logs to stderr only
            self.emit(pid, "stderr", b"warn\n")
        return await self.info(pid)

    async def read(
        self,
        process_id: str,
        stream: StreamName = "stdout",
        *,
        cursor: int = 0,
        max_bytes: int = 65536,
        wait_s: float = 0.0,
    ) -> StreamChunk:
        self.calls.append("read")
        if cursor < 0 or max_bytes < 1 or wait_s < 0:
            raise OperationError("bad read", code="invalid_argument")
        proc = self._get(process_id)
        s = proc.streams[stream]
        if cursor < s.start:
            raise CursorExpiredError("expired", earliest=s.start)
        if s.ended and cursor > s.end:
            raise OperationError("cursor beyond the end", code="invalid_argument")
        with anyio.move_on_after(wait_s):
            while cursor >= s.end and not s.ended:
                await proc.changed.wait()
        if cursor < s.start:
            raise CursorExpiredError("expired", earliest=s.start)
        lo = cursor - s.start
        data = bytes(s.data[lo : lo + max_bytes])
        nxt = cursor + len(data)
        return StreamChunk(data, cursor, nxt, s.ended and nxt == s.end)

    async def write_stdin(self, process_id: str, data: bytes) -> None:
        self.calls.append("write_stdin")
        proc = self._get(process_id)
        if not proc.info.stdin_open:
            raise OperationError("stdin is closed", code="closed")
        self.written.append(data)
        if proc.request.terminal is not None or proc.request.command == "cat":
            self.emit(process_id, "stdout", data)

    async def close_stdin(self, process_id: str) -> None:
        self.calls.append("close_stdin")
        proc = self._get(process_id)
        proc.info = attrs.evolve(proc.info, stdin_open=False)

    async def wait(self, process_id: str, *, timeout_s: float) -> ProcessInfo:
        self.calls.append("wait")
        proc = self._get(process_id)
        with anyio.move_on_after(timeout_s):
            while proc.info.state == "running":
                await proc.changed.wait()
        return await self.info(process_id)

    async def signal(self, process_id: str, signal: int) -> None:
        self.calls.append("signal")
        self._get(process_id)

    async def kill(self, process_id: str) -> ProcessInfo:
        self.calls.append("kill")
        proc = self._get(process_id)
        if proc.info.state == "running":
            self.finish(process_id, None, state="killed")
        return await self.info(process_id)

    async def resize(self, process_id: str, size: TerminalSize) -> None:
        self.calls.append("resize")
        proc = self._get(process_id)
        if proc.info.terminal is None:
            raise OperationError("no terminal", code="invalid_argument")
        proc.info = attrs.evolve(proc.info, terminal=size)

    async def info(self, process_id: str) -> ProcessInfo:
        proc = self._get(process_id)
        out, err = proc.streams["stdout"], proc.streams["stderr"]
        return attrs.evolve(
            proc.info,
            stdout_end=out.end,
            stderr_end=err.end,
            stdout_start=out.start,
            stderr_start=err.start,
        )

    async def list(self) -> Sequence[ProcessInfo]:
        self.calls.append("list")
        return [await self.info(pid) for pid in self._procs]

    async def remove(self, process_id: str) -> None:
        self.calls.append("remove")
        proc = self._get(process_id)
        if proc.info.state == "running":
            raise OperationError("running", code="invalid_argument")
        del self._procs[process_id]
