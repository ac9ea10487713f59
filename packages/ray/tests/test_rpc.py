"""The direct channel's codec and framing, no cluster: a closed set of types, bounded frames."""

from __future__ import annotations

import contextlib
import re

import anyio
import anyio.abc
import pytest

from corral._regex import get_regex_engine
from corral.provider import (
    CommandRequest,
    ExecResult,
    FileEntry,
    GrepMatch,
    GrepResult,
    ProcessInfo,
    StreamChunk,
    TerminalSize,
)
from corral_ray._rpc import (
    MAX_FRAME,
    AgentServer,
    ChannelUnreachableError,
    CodecError,
    Endpoint,
    FrameError,
    NotEncodableError,
    decode_message,
    decode_request,
    direct_client,
    encode_message,
    encode_request,
    frames,
    read_message,
)

pytestmark = pytest.mark.anyio


def test_records_and_containers_round_trip_as_themselves() -> None:
    values = [
        ("ok", b"\x00bytes", 1, 2.5, None, True, "text"),
        CommandRequest(command="true", env={"A": "b"}, allowed_commands=frozenset({"true"})),
        ExecResult(exit_code=0, stdout="x", duration_ms=1.5),
        (FileEntry(name="a", path="/a", type="file", size=3),),
        GrepResult(matches=(GrepMatch(path="/a", line_number=1, line="x"),)),
        ProcessInfo(
            process_id="p1",
            command="sleep 1",
            state="running",
            exit_code=None,
            signal=None,
            started_at=1.0,
            ended_at=None,
            terminal=TerminalSize(cols=80, rows=24),
        ),
        StreamChunk(data=b"out", cursor=0, next_cursor=3, ended=False),
        {"nested": [frozenset({"a"}), ("t",)]},
    ]
    for value in values:
        assert decode_message(encode_message(value)) == value


def test_values_outside_the_closed_set_are_not_encodable() -> None:
    # A compiled matcher, arbitrary objects: never pickled, the actor path takes them.
    with pytest.raises(NotEncodableError):
        encode_request("k", "fs", "grep", (get_regex_engine().compile("x"),), {})
    with pytest.raises(NotEncodableError):
        encode_message(object())
    with pytest.raises(NotEncodableError):
        encode_message(re.compile("x"))


def test_decoding_refuses_unknown_records_fields_and_shapes() -> None:
    import msgpack  # type: ignore[import-untyped]

    def record(name: object, fields: object) -> bytes:
        inner = msgpack.packb([name, fields], use_bin_type=True)
        return bytes(msgpack.packb(msgpack.ExtType(3, inner), use_bin_type=True))

    bad = [
        b"\xc1",  # never used in msgpack
        record("Popen", {"args": "sh"}),  # not in the closed set
        record("TerminalSize", {"cols": 80, "rows": 24, "evil": 1}),  # unknown field
        record("TerminalSize", {"cols": -1, "rows": 24}),  # its validator refuses
        bytes(msgpack.packb(msgpack.ExtType(99, b"\x90"), use_bin_type=True)),
    ]
    for data in bad:
        with pytest.raises(CodecError) as caught:
            decode_message(data)
        assert "Popen" not in str(caught.value)
    assert decode_message(record("TerminalSize", {"cols": 80, "rows": 24})) == TerminalSize(
        cols=80, rows=24
    )
    for shape in (["k", "fs"], ["k", "fs", "ls", {}, {}], [1, "fs", "ls", [], {}]):
        with pytest.raises(CodecError):
            decode_request(encode_message(shape))
    assert decode_request(encode_request("k", "fs", "ls", ("/",), {})) == (
        "k",
        "fs",
        "ls",
        ("/",),
        {},
    )


async def test_messages_stream_in_bounded_frames_and_oversized_frames_are_refused() -> None:
    big = bytes(range(256)) * (3 * MAX_FRAME // 256 + 7)
    pieces = frames(big)
    assert len(pieces) == 4
    assert all(len(p) <= MAX_FRAME + 5 for p in pieces)

    def reader(data: bytes) -> object:
        view = memoryview(data)
        pos = 0

        async def receive_exactly(n: int) -> bytes:
            nonlocal pos
            if pos + n > len(view):
                raise anyio.IncompleteRead
            pos += n
            return view[pos - n : pos].tobytes()

        return receive_exactly

    assert await read_message(reader(b"".join(pieces))) == big  # type: ignore[arg-type]
    oversized = (MAX_FRAME + 1).to_bytes(4, "big") + b"\0"
    with pytest.raises(FrameError):
        await read_message(reader(oversized + b"x" * 10))  # type: ignore[arg-type]
    with pytest.raises(FrameError):  # a message above the caller's limit
        await read_message(reader(b"".join(pieces)), limit=MAX_FRAME)  # type: ignore[arg-type]
    with pytest.raises(FrameError):  # unknown flags
        await read_message(reader(b"\0\0\0\1\x02x"))  # type: ignore[arg-type]


async def test_client_refuses_a_peer_that_cannot_prove_it_is_the_agent() -> None:
    # E.g. a process that took the port of a dead agent: it never learns the secret.
    async def squatter(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.send(frames(b"n" * 32)[0])
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                await stream.receive()  # the client's proof
                await stream.send(frames(b"ok")[0])
                await stream.receive()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, squatter)
        endpoint = Endpoint(host="127.0.0.1", port=port, secret=b"s" * 32)
        with pytest.raises(ChannelUnreachableError):
            await direct_client().call(endpoint, encode_request("k", "fs", "ls", ("/",), {}))
        assert direct_client().is_down(endpoint)
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_agent_server_answers_an_authenticated_client() -> None:
    calls: list[tuple[object, ...]] = []

    async def handle(*call: object) -> tuple[object, ...]:
        calls.append(call)
        return ("ok", FileEntry(name="a", path="/a", type="file", size=1))

    server = AgentServer(handle)  # type: ignore[arg-type]
    host, port = await server.start("127.0.0.1")
    endpoint = Endpoint(host=host, port=port, secret=server.secret)
    try:
        for _ in range(2):  # the second call reuses the pooled connection
            raw = await direct_client().call(endpoint, encode_request("k", "fs", "ls", ("/",), {}))
            assert decode_message(raw) == (
                "ok",
                FileEntry(name="a", path="/a", type="file", size=1),
            )
        assert calls == [("k", "fs", "ls", ("/",), {})] * 2
        impostor = Endpoint(host=host, port=port, secret=b"w" * 32)
        with pytest.raises(ChannelUnreachableError):
            await direct_client().call(impostor, encode_request("k", "fs", "ls", ("/",), {}))
        assert len(calls) == 2
    finally:
        await direct_client().release(endpoint)
        server.close()
        await anyio.sleep(0.05)  # the server's connection handlers see the close
