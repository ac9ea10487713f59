"""Streaming a command's output for library users (``WorkspaceSession.stream``).

Over the scripted ProcessManager: chunks arrive as the process produces
them, bytes exact and text never cut inside a character; the final result is
what ``workspace_run`` reports; leaving early kills the process; a session
without the ``process`` capability is told so.
"""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

import corral
from corral import OperationError, OutputChunk, WorkspaceSession

from ._process_fake import FakeProcessManager
from .test_process_tools import ProcessProvider

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def session(
    capabilities: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[WorkspaceSession, FakeProcessManager]]:
    provider = ProcessProvider()
    async with corral.open_workspace(
        provider,
        capabilities if capabilities is not None else {"process": {"env": {"A": "1"}}},
        plugins=corral.load_plugins(entrypoints=False),
    ) as ws:
        yield ws, provider.manager


async def _produce(manager: FakeProcessManager, pieces: list[tuple[str, bytes]]) -> None:
    while not manager.requests:
        await anyio.sleep(0)
    for stream, data in pieces:
        await anyio.sleep(0.001)
        manager.emit("p1", stream, data)  # type: ignore[arg-type]
    manager.finish("p1", 3)


async def test_chunks_arrive_as_produced_and_the_result_follows() -> None:
    text = "héllo → wörld\n"
    data = text.encode()
    # Split inside multi-byte characters on purpose.
    pieces = [
        ("stdout", data[:2]),
        ("stderr", b"warn\n"),
        ("stdout", data[2:9]),
        ("stdout", data[9:]),
    ]
    async with session() as (ws, manager):
        seen: list[OutputChunk] = []
        async with anyio.create_task_group() as group, await ws.stream("build", cwd="/src") as run:
            group.start_soon(_produce, manager, pieces)
            async for chunk in run:
                seen.append(chunk)
        out = [c for c in seen if c.stream == "stdout"]
        assert b"".join(c.data for c in out) == data
        assert "".join(c.text for c in out) == text
        assert all("\ufffd" not in c.text for c in out)
        assert [c.cursor for c in out] == [0, 2, 9]
        assert b"".join(c.data for c in seen if c.stream == "stderr") == b"warn\n"
        result = run.result
        assert (result.exit_code, result.stdout, result.stderr) == (3, text, "warn\n")
        assert not result.stdout_truncated
        request = manager.requests[0]
        assert (request.command, request.cwd, dict(request.env)) == ("build", "/src", {"A": "1"})
        assert "remove" in manager.calls  # the handle does not outlive the stream


async def test_leaving_early_kills_the_process() -> None:
    async with session() as (ws, manager):
        async with await ws.stream("server") as run:
            manager.emit("p1", "stdout", b"listening\n")
            async for chunk in run:
                assert chunk.text == "listening\n"
                break
        assert "kill" in manager.calls
        assert await manager.list() == []
        with pytest.raises(RuntimeError, match="read to the end"):
            _ = run.result


async def test_a_callback_sees_every_chunk() -> None:
    async with session() as (ws, manager):
        sync_seen: list[bytes] = []
        async with anyio.create_task_group() as group:
            group.start_soon(_produce, manager, [("stdout", b"a"), ("stdout", b"b")])
            result = await ws.run_streaming("x", lambda c: sync_seen.append(c.data))
        assert b"".join(sync_seen) == b"ab"
        assert result.stdout == "ab"


async def test_an_async_callback_is_awaited_and_output_is_capped() -> None:
    async with session() as (ws, manager):
        async_seen: list[str] = []

        async def on_output(chunk: OutputChunk) -> None:
            await anyio.sleep(0)
            async_seen.append(chunk.text)

        async with anyio.create_task_group() as group:
            group.start_soon(_produce, manager, [("stdout", b"12345"), ("stdout", b"678")])
            result = await ws.run_streaming("x", on_output, max_output_bytes=4)
        assert "".join(async_seen) == "12345678"
        assert (result.stdout, result.stdout_truncated) == ("1234", True)


async def test_without_the_process_capability_streaming_says_so() -> None:
    async with session({"fs": True}) as (ws, manager):
        with pytest.raises(OperationError) as caught:
            await ws.stream("ls")
        assert caught.value.code == "unsupported"
        assert "'process' capability" in caught.value.message
        assert manager.calls == []


async def test_a_timeout_beyond_the_policy_starts_nothing() -> None:
    async with session({"process": {"max_timeout_s": 10, "timeout_s": 5}}) as (ws, manager):
        with pytest.raises(OperationError) as caught:
            await ws.stream("ls", timeout_s=11)
        assert caught.value.code == "invalid_argument"
        assert manager.calls == []


async def test_code_streams_through_an_unbuffered_fresh_interpreter() -> None:
    async with session() as (ws, manager):
        code = 'print("it\'s"); x = $HOME; y = `ls`'
        async with await ws.stream_code(code) as run:
            manager.finish("p1", 0)
            assert [chunk async for chunk in run] == []
        assert shlex.split(manager.requests[0].command) == ["python3", "-u", "-c", code]
        with pytest.raises(OperationError) as caught:
            await ws.stream_code("1", language="cobol")
        assert caught.value.code == "unsupported"
        assert "cobol" not in caught.value.message


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_run_streaming_without_async(backend: str) -> None:
    import corral.sync

    provider = ProcessProvider()
    provider.manager.start = _echo_twice(provider.manager)  # type: ignore[method-assign]
    seen: list[str] = []
    with corral.sync.open_workspace(
        provider,
        {"process": True},
        backend=backend,  # type: ignore[arg-type]
        plugins=corral.load_plugins(entrypoints=False),
    ) as ws:
        result = ws.run_streaming("twice", lambda chunk: seen.append(chunk.text))
    assert "".join(seen) == "a\nb\n"
    assert (result.exit_code, result.stdout) == (0, "a\nb\n")


def _echo_twice(manager: FakeProcessManager) -> Any:
    """A start whose process prints two lines and exits."""
    start = manager.start

    async def started(request: Any) -> Any:
        info = await start(request)
        manager.emit(info.process_id, "stdout", b"a\n")
        manager.emit(info.process_id, "stdout", b"b\n")
        manager.finish(info.process_id, 0)
        return info

    return started
