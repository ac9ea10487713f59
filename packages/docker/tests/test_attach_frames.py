"""The attached stream's framing, without a daemon: frames split anywhere, the exit trailer.

The Engine API multiplexes a non-TTY exec's output as ``[stream, 0, 0, 0,
size:u32be]`` + payload; TCP and ssh deliver those bytes in arbitrary pieces,
so every split point must give the same output. Over ssh the exit status is
a ``\\0corral-exit-NONCE:CODE`` trailer on stderr that must be cut from the
output and parsed, wherever the pieces end.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest

from corral_docker._attach import AttachedExec

pytestmark = pytest.mark.anyio

TRAILER = b"\0corral-exit-0123456789abcdef:"


class _Pieces:
    """A stand-in for the hijacked pipe: hands out preset pieces, then EOF."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)
        self.closed = False

    def recv(self) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""

    def close(self) -> None:
        self.closed = True


def _frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", kind, len(payload)) + payload


async def _unused_call(what: str, fn: Any) -> Any:
    raise AssertionError(f"no engine call expected ({what})")


async def _collect(pieces: list[bytes], *, tty: bool = False, trailer: bytes = b"") -> Any:
    pipe = _Pieces(pieces)
    attached = AttachedExec(pipe, "exec-id", _unused_call, tty=tty, trailer=trailer)  # type: ignore[arg-type]
    out = {"stdout": b"", "stderr": b""}
    while (chunks := await attached.receive()) is not None:
        for name, data in chunks:
            out[name] += data
    code = await attached.exit_code() if trailer else None
    await attached.aclose()
    assert pipe.closed
    return out["stdout"], out["stderr"], code


def _splits(data: bytes, step: int) -> list[bytes]:
    return [data[i : i + step] for i in range(0, len(data), step)]


@pytest.mark.parametrize("step", [1, 2, 3, 7, 8, 9, 64, 1 << 20])
async def test_frames_split_anywhere(step: int) -> None:
    stream = (
        _frame(1, b"hello ")
        + _frame(2, b"\0\xff err")
        + _frame(1, b"")
        + _frame(1, b"world")
        + _frame(0, b"ignored stdin echo")
    )
    out, err, _ = await _collect(_splits(stream, step))
    assert (out, err) == (b"hello world", b"\0\xff err")


@pytest.mark.parametrize("step", [1, 5, 13, 40, 1 << 20])
async def test_trailer_is_cut_and_parsed_wherever_it_splits(step: int) -> None:
    stream = _frame(1, b"out") + _frame(2, b"real stderr\n") + _frame(2, TRAILER + b"42")
    out, err, code = await _collect(_splits(stream, step), trailer=TRAILER)
    assert (out, err, code) == (b"out", b"real stderr\n", 42)


async def test_a_forged_trailer_with_another_nonce_is_output() -> None:
    forged = b"\0corral-exit-ffffffffffffffff:0"
    stream = _frame(2, forged) + _frame(2, TRAILER + b"3")
    _, err, code = await _collect([stream], trailer=TRAILER)
    assert (err, code) == (forged, 3)


async def test_no_trailer_keeps_all_stderr_and_asks_the_engine_for_the_status() -> None:
    class _Api:
        def exec_inspect(self, exec_id: str) -> dict[str, Any]:
            return {"Running": False, "ExitCode": 137}

    async def call(what: str, fn: Any) -> Any:
        return fn(_Api())

    stream = _frame(2, b"killed before the trailer")
    pipe: Any = _Pieces(_splits(stream, 3))
    attached = AttachedExec(pipe, "exec-id", call, trailer=TRAILER, tty=False)
    err = b""
    while (chunks := await attached.receive()) is not None:
        err += b"".join(data for _, data in chunks)
    assert (err, await attached.exit_code()) == (b"killed before the trailer", 137)


async def test_tty_output_is_raw() -> None:
    raw = _frame(1, b"looks like a frame") + b"\r\n"
    out, err, _ = await _collect(_splits(raw, 4), tty=True)
    assert (out, err) == (raw, b"")
