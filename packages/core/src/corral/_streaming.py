"""Output as it is produced, for library users: commands run on the process module.

``workspace_run`` returns when the command ends. A program that wants to show
a build's output while it runs, or react to a line as it appears, streams
instead::

    async with session.stream("make -j8") as run:
        async for chunk in run:
            print(chunk.text, end="")
    print(run.result.exit_code)

or hands a callback to :meth:`corral.WorkspaceSession.run_streaming`. The
command runs as a process of the workspace's ``process`` module (so the
workspace must declare the ``process`` capability, and its policy applies),
both streams are read by cursor concurrently, and the final
:class:`corral.ExecResult` is the one ``workspace_run`` would have returned.
Leaving the ``async with`` block early, or being cancelled, kills the
process and its tree: nothing keeps running that nobody reads.
"""

from __future__ import annotations

import codecs
import contextlib
import inspect
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Final

import anyio
import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._data import ExecResult
from ._errors import OperationError
from ._policies import ProcessPolicy
from ._process import CursorExpiredError, ProcessManager, ProcessRequest, StreamName

__all__ = ["CODE_COMMANDS", "CommandStream", "OutputCallback", "OutputChunk", "code_command"]

CODE_COMMANDS: Final[Mapping[str, tuple[str, ...]]] = {"python": ("python3", "-u", "-c")}
"""How a streamed snippet runs, per language: a fresh interpreter, unbuffered
(``-u``: without it Python holds its output back until it exits, and
nothing would stream)."""

_READ_BYTES: Final = 1 << 16
_POLL_S: Final = 5.0
"""Longest one read waits; a read returns as soon as bytes arrive, so this only bounds idling."""


@attrs.frozen
class OutputChunk:
    """Output of a streamed command, in the order each stream produced it.

    Attributes:
        stream: ``stdout`` or ``stderr``.
        data: The bytes, exactly as produced.
        text: ``data`` decoded as UTF-8; a character split between two chunks
            is decoded whole in the later one, and undecodable bytes become
            U+FFFD.
        cursor: Byte offset of ``data`` in its stream.
        skipped: Bytes lost before this chunk because the reader fell
            behind the retained window (0 normally).
    """

    stream: StreamName
    data: bytes
    text: str
    cursor: int
    skipped: int = 0


OutputCallback = Callable[[OutputChunk], "Awaitable[None] | None"]
"""Called with each chunk as it arrives (a plain function or a coroutine function)."""


class _Collected:
    """What the final result keeps of one stream: text up to a cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.truncated = False

    def add(self, data: bytes) -> None:
        room = self.cap - len(self.data)
        if len(data) > room:
            self.truncated = True
        self.data += data[: max(room, 0)]

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


class CommandStream:
    """One command streamed through a process module; see the module docstring.

    Use it as an async context manager; iterate it for chunks; read
    :attr:`result` after the iteration ended.

    Args:
        manager: The workspace's process module.
        request: The process to start.
        max_output_bytes: Bytes of each stream kept for :attr:`result`
            (the chunks carry everything regardless).
    """

    def __init__(
        self, manager: ProcessManager, request: ProcessRequest, *, max_output_bytes: int
    ) -> None:
        self._manager = manager
        self._request = request
        self._collected = {
            "stdout": _Collected(max_output_bytes),
            "stderr": _Collected(max_output_bytes),
        }
        self._stack = AsyncExitStack()
        self._receive: MemoryObjectReceiveStream[OutputChunk] | None = None
        self._process_id: str | None = None
        self._started = 0.0
        self._result: ExecResult | None = None

    @property
    def process_id(self) -> str | None:
        """The process's handle once started."""
        return self._process_id

    @property
    def result(self) -> ExecResult:
        """The command's outcome, as ``workspace_run`` reports it.

        Raises:
            RuntimeError: The output was not read to its end yet.
        """
        if self._result is None:
            raise RuntimeError("the result is known once the output has been read to the end")
        return self._result

    async def __aenter__(self) -> CommandStream:
        self._started = time.perf_counter()
        info = await self._manager.start(self._request)
        self._process_id = info.process_id
        self._stack.push_async_callback(self._cleanup)
        send, receive = anyio.create_memory_object_stream[OutputChunk](16)
        self._receive = receive
        group = await self._stack.enter_async_context(anyio.create_task_group())
        group.start_soon(self._pump, send)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Kill before the task group waits for its readers: they end with the streams.
        with anyio.CancelScope(shield=True):
            await self._kill_if_running()
        if self._receive is not None:
            self._receive.close()
        await self._stack.__aexit__(exc_type, exc, tb)

    def __aiter__(self) -> CommandStream:
        return self

    async def __anext__(self) -> OutputChunk:
        # A plain iterator, not an async generator: breaking out of the loop
        # leaves nothing half-finished for the garbage collector (trio warns).
        if self._receive is None:
            raise RuntimeError("use 'async with' before iterating a CommandStream")
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            if self._result is None:
                await self._finish()
            raise StopAsyncIteration from None

    async def _pump(self, send: MemoryObjectSendStream[OutputChunk]) -> None:
        async with send, anyio.create_task_group() as group:
            for stream in ("stdout", "stderr"):
                group.start_soon(self._read_stream, stream, send.clone())

    async def _read_stream(
        self, stream: StreamName, send: MemoryObjectSendStream[OutputChunk]
    ) -> None:
        assert self._process_id is not None
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        collected = self._collected[stream]
        cursor = skipped = 0
        async with send:
            while True:
                try:
                    chunk = await self._manager.read(
                        self._process_id,
                        stream,
                        cursor=cursor,
                        max_bytes=_READ_BYTES,
                        wait_s=_POLL_S,
                    )
                except CursorExpiredError as exc:
                    skipped += exc.earliest - cursor
                    collected.truncated = True
                    cursor = exc.earliest
                    continue
                if chunk.data or chunk.ended:
                    text = decoder.decode(chunk.data, final=chunk.ended)
                    collected.add(chunk.data)
                    if chunk.data or text:
                        try:
                            await send.send(OutputChunk(stream, chunk.data, text, cursor, skipped))
                        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                            return  # the reader left early; the process is being killed
                    skipped = 0
                cursor = chunk.next_cursor
                if chunk.ended:
                    return

    async def _finish(self) -> None:
        assert self._process_id is not None
        info = await self._manager.wait(self._process_id, timeout_s=_POLL_S)
        while info.state == "running":  # streams ended before the exit was observed
            info = await self._manager.wait(self._process_id, timeout_s=_POLL_S)
        out, err = self._collected["stdout"], self._collected["stderr"]
        self._result = ExecResult(
            exit_code=info.exit_code,
            stdout=out.text(),
            stderr=err.text(),
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            duration_ms=(time.perf_counter() - self._started) * 1000,
            signal=info.signal,
            timed_out=info.state == "killed" and info.reason == "timeout",
        )

    async def _kill_if_running(self) -> None:
        if self._process_id is None or self._result is not None:
            return
        # An error means it is already gone with its workspace: nothing left to stop.
        with contextlib.suppress(OperationError):
            await self._manager.kill(self._process_id)

    async def _cleanup(self) -> None:
        if self._process_id is None:
            return
        with anyio.CancelScope(shield=True):
            # An error means it still runs (a failed kill) or the workspace closed.
            with contextlib.suppress(OperationError):
                await self._manager.remove(self._process_id)


def code_command(language: str, code: str) -> str:
    """The command line that runs ``code`` in a fresh interpreter of ``language``.

    Raises:
        OperationError: ``unsupported`` for a language without a streamed runner.
    """
    argv = CODE_COMMANDS.get(language)
    if argv is None:
        raise OperationError(
            f"streaming code runs {', '.join(sorted(CODE_COMMANDS))} only", code="unsupported"
        )
    return shlex.join([*argv, code])


def stream_request(
    command: str,
    policy: ProcessPolicy,
    *,
    cwd: str | None,
    env: Mapping[str, str] | None,
    timeout_s: float | None,
) -> ProcessRequest:
    """The process request a streamed command becomes under the session's policy.

    Raises:
        OperationError: ``invalid_argument`` for a timeout above the policy's.
    """
    timeout = policy.timeout_s if timeout_s is None else timeout_s
    if not timeout > 0 or timeout > policy.max_timeout_s:
        raise OperationError(
            f"timeout_s must be above 0 and at most {policy.max_timeout_s:g}",
            code="invalid_argument",
        )
    return ProcessRequest(
        command=command,
        cwd=cwd,
        env={**policy.env, **(env or {})},
        timeout_s=timeout,
        retained_bytes=policy.retained_bytes,
        allowed_commands=policy.allowed_commands,
        allow_shell_syntax=policy.allow_shell_syntax,
    )


async def run_with_callback(stream: CommandStream, on_output: OutputCallback | None) -> ExecResult:
    """Drive ``stream`` to its end, handing each chunk to ``on_output``."""
    async with stream:
        async for chunk in stream:
            if on_output is not None:
                outcome = on_output(chunk)
                if inspect.isawaitable(outcome):
                    await outcome
    return stream.result
