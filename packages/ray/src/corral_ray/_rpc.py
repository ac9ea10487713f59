"""The direct channel: workspace calls over an authenticated TCP connection to the node agent.

Why not an actor call per operation: a Ray actor call costs about a
millisecond before the call does anything (plus a thread hop inside the
actor), and the ray provider's goal is at most +1 ms per call over the inner
provider. So Ray keeps placement, lifecycle, leases and discovery, and each
agent also serves workspace calls on a small TCP server that runs on the
agent's own event loop (where the inner workspaces live): one call is one
socket round trip.

The protocol, kept small enough to audit:

* **Frames**: a 4-byte big-endian length, one flag byte (``1``: more frames
  of this message follow) and at most :data:`MAX_FRAME` bytes of payload. A
  message is its frames' payloads joined, at most :data:`MAX_MESSAGE`
  bytes; big file contents therefore stream in 1 MiB pieces. A peer that
  announces a bigger frame or message is disconnected.
* **Handshake**: the agent sends a random nonce, the client answers
  ``HMAC-SHA256(secret, nonce)``, the agent compares in constant time and
  either closes the connection without a word or confirms with an HMAC of
  its own (so a process squatting a dead agent's port cannot pose as the
  agent). The secret is random per agent and only ever travels inside Ray
  (the agent's ``endpoint`` call), so only a process attached to the
  cluster -- which can call the actor anyway -- can use the channel. At
  most 256 connections may be unauthenticated at once (10 s each).
* **Messages**: a request is ``[key, module, method, args, kwargs]``, a reply
  is the :mod:`corral_ray._wire` tuple. Both are msgpack with a closed set of
  extensions: tuples, frozensets and corral's own data records by name
  (rebuilt through their constructors, so their validators run). Never
  pickle: a value of any other type cannot be encoded and the driver sends
  that one call through the actor path instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import socket
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import anyio
import anyio.abc
import anyio.lowlevel
import attrs
import msgpack  # type: ignore[import-untyped]
from anyio.streams.buffered import BufferedByteReceiveStream

from ._wire import Reply

__all__ = [
    "MAX_FRAME",
    "MAX_MESSAGE",
    "AgentServer",
    "ChannelBrokenError",
    "ChannelUnreachableError",
    "CodecError",
    "DirectClient",
    "Endpoint",
    "NotEncodableError",
    "decode_message",
    "decode_request",
    "direct_client",
    "encode_message",
    "encode_request",
    "frames",
    "read_message",
]

log = logging.getLogger("corral.ray")

MAX_FRAME: Final = 1 << 20
"""Largest frame payload (1 MiB); a bigger announced frame closes the connection."""
MAX_MESSAGE: Final = 256 << 20
"""Largest message (256 MiB, file contents included); bigger requests take the actor path."""
_HEADER: Final = 5
_MORE: Final = 1
_NONCE_BYTES: Final = 32
_PROOF_LIMIT: Final = 64
_HANDSHAKE_S: Final = 10.0
_CONNECT_S: Final = 3.0
_MAX_IDLE: Final = 256
_AGENT_SIDE: Final = b"corral-ray agent"
_MAX_UNAUTHENTICATED: Final = 256

_EXT_TUPLE: Final = 1
_EXT_FROZENSET: Final = 2
_EXT_RECORD: Final = 3


class FrameError(Exception):
    """The peer broke the framing (oversized frame or message, bad flags)."""


class CodecError(Exception):
    """A message could not be decoded (not msgpack, unknown record, invalid field)."""


class NotEncodableError(TypeError):
    """A value has no encoding on the channel (the caller uses the actor path instead)."""


class ChannelUnreachableError(Exception):
    """No authenticated connection to the agent could be made; nothing was sent."""


class ChannelBrokenError(Exception):
    """The connection failed after the request was sent: the call may or may not have run."""


# ---------------------------------------------------------------------------
# values


def _record_types() -> dict[str, type]:
    from corral import provider as p

    names = (
        "CodeContextInfo",
        "CodeOutput",
        "CommandRequest",
        "ExecError",
        "ExecResult",
        "FileEntry",
        "FileStat",
        "GrepMatch",
        "GrepOptions",
        "GrepResult",
        "ProcessInfo",
        "ProcessRequest",
        "SnapshotInfo",
        "StreamChunk",
        "TerminalSize",
        "VersionChange",
    )
    return {name: getattr(p, name) for name in names if hasattr(p, name)}


_TYPES: Final = _record_types()
_NAMES: Final = {cls: name for name, cls in _TYPES.items()}
_FIELDS: Final = {
    cls: tuple((f.name, f.alias or f.name) for f in attrs.fields(cls) if f.init)
    for cls in _TYPES.values()
}


def _pack(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value, default=_default, use_bin_type=True, strict_types=True)
    return packed


def _default(obj: Any) -> Any:
    kind = type(obj)
    if kind is tuple:
        return msgpack.ExtType(_EXT_TUPLE, _pack(list(obj)))
    if kind is frozenset or kind is set:
        return msgpack.ExtType(_EXT_FROZENSET, _pack(list(obj)))
    name = _NAMES.get(kind)
    if name is not None:
        fields = {alias: getattr(obj, attr) for attr, alias in _FIELDS[kind]}
        return msgpack.ExtType(_EXT_RECORD, _pack([name, fields]))
    # Subclasses of plain types travel as the plain type (strict_types hands them here).
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj)
    if isinstance(obj, Mapping):
        return dict(obj)
    if isinstance(obj, (list, tuple)):
        return list(obj)
    raise NotEncodableError("a value of this type has no channel encoding")


def _ext(code: int, data: bytes) -> Any:
    value = msgpack.unpackb(data, ext_hook=_ext, raw=False, strict_map_key=True)
    if code == _EXT_TUPLE and type(value) is list:
        return tuple(value)
    if code == _EXT_FROZENSET and type(value) is list:
        return frozenset(value)
    if code == _EXT_RECORD and type(value) is list and len(value) == 2:
        name, fields = value
        cls = _TYPES.get(name) if type(name) is str else None
        if cls is not None and type(fields) is dict:
            allowed = {alias for _attr, alias in _FIELDS[cls]}
            if set(fields) <= allowed:
                return cls(**fields)
    raise CodecError("unknown extension")


def encode_message(value: Any) -> bytes:
    """A value as channel bytes.

    Raises:
        NotEncodableError: The value holds a type outside the closed set.
    """
    try:
        return _pack(value)
    except NotEncodableError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise NotEncodableError("the value has no channel encoding") from exc


def decode_message(data: bytes) -> Any:
    """The value channel bytes encode.

    Raises:
        CodecError: Anything wrong with the bytes (never echoed).
    """
    try:
        return msgpack.unpackb(data, ext_hook=_ext, raw=False, strict_map_key=True)
    except Exception as exc:  # malformed input of any kind: one error, no detail
        raise CodecError("the message could not be decoded") from exc


def encode_request(
    key: str, module: str, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> bytes:
    """A call request; raises :class:`NotEncodableError` for arguments outside the closed set."""
    return encode_message([key, module, method, list(args), dict(kwargs)])


def decode_request(data: bytes) -> tuple[str, str, str, tuple[Any, ...], dict[str, Any]]:
    """A call request, shape checked.

    Raises:
        CodecError: Not a well-formed request.
    """
    value = decode_message(data)
    if type(value) is list and len(value) == 5:
        key, module, method, args, kwargs = value
        if (
            type(key) is str
            and type(module) is str
            and type(method) is str
            and type(args) is list
            and type(kwargs) is dict
            and all(type(k) is str for k in kwargs)
        ):
            return key, module, method, tuple(args), kwargs
    raise CodecError("the request is malformed")


# ---------------------------------------------------------------------------
# frames


def frames(message: bytes) -> list[bytes]:
    """The frames that carry a message (one for anything up to :data:`MAX_FRAME`)."""
    if len(message) <= MAX_FRAME:
        return [len(message).to_bytes(4, "big") + b"\0" + message]
    view = memoryview(message)
    out = []
    for start in range(0, len(message), MAX_FRAME):
        piece = view[start : start + MAX_FRAME]
        more = _MORE if start + MAX_FRAME < len(message) else 0
        out.append(len(piece).to_bytes(4, "big") + bytes((more,)) + piece.tobytes())
    return out


async def read_message(
    receive_exactly: Callable[[int], Awaitable[bytes]], limit: int = MAX_MESSAGE
) -> bytes:
    """Read one message's frames.

    Raises:
        FrameError: A frame above :data:`MAX_FRAME`, a message above ``limit``, unknown flags.
    """
    parts: list[bytes] = []
    total = 0
    while True:
        header = await receive_exactly(_HEADER)
        length = int.from_bytes(header[:4], "big")
        flags = header[4]
        if length > MAX_FRAME or flags & ~_MORE or total + length > limit:
            raise FrameError("frame refused")
        if length:
            parts.append(await receive_exactly(length))
        total += length
        if not flags & _MORE:
            return parts[0] if len(parts) == 1 else b"".join(parts)


def _proof(secret: bytes, nonce: bytes) -> bytes:
    """The client's answer to the agent's nonce."""
    return hmac.new(secret, nonce, hashlib.sha256).digest()


def _confirmation(secret: bytes, nonce: bytes) -> bytes:
    """The agent's answer: proves to the client that it talks to the agent, not a squatter.

    Without it, a process that took the port of a dead agent could
    confirm anything and receive the driver's file contents and commands.
    """
    return hmac.new(secret, _AGENT_SIDE + nonce, hashlib.sha256).digest()


# ---------------------------------------------------------------------------
# the agent's side


class AgentServer:
    """The agent's TCP server; runs on the agent's asyncio loop, where its workspaces live.

    Args:
        handle: Turns a decoded request into a reply (the agent's ``call``).
    """

    def __init__(
        self,
        handle: Callable[[str, str, str, tuple[Any, ...], dict[str, Any]], Awaitable[Reply]],
    ) -> None:
        self._handle = handle
        self.secret = secrets.token_bytes(32)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._unauthenticated = 0
        self.address: tuple[str, int] | None = None

    async def start(self, host: str) -> tuple[str, int]:
        """Listen on ``host`` (the node's address) on a free port; returns ``(host, port)``."""
        if self.address is None:
            self._server = await asyncio.start_server(self._serve, host, 0, limit=MAX_FRAME)
            port = int(self._server.sockets[0].getsockname()[1])
            self.address = (host, port)
        return self.address

    def close(self) -> None:
        """Stop listening and drop every connection."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        authenticated = False
        self._unauthenticated += 1
        try:
            if self._unauthenticated > _MAX_UNAUTHENTICATED:
                return  # a flood of connections that never authenticate: drop the excess
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = secrets.token_bytes(_NONCE_BYTES)
            writer.write(frames(nonce)[0])
            async with asyncio.timeout(_HANDSHAKE_S):
                proof = await read_message(reader.readexactly, limit=_PROOF_LIMIT)
            if not hmac.compare_digest(proof, _proof(self.secret, nonce)):
                return  # closed without a word
            authenticated = True
            self._unauthenticated -= 1
            writer.write(frames(_confirmation(self.secret, nonce))[0])
            while True:
                request = await read_message(reader.readexactly)
                reply = await self._reply_unless_abandoned(request, reader)
                if reply is None:
                    return
                for frame in frames(reply):
                    writer.write(frame)
                    await writer.drain()
        except (
            OSError,
            EOFError,
            asyncio.IncompleteReadError,
            TimeoutError,
            FrameError,
        ):
            pass  # the peer left, broke the framing or never authenticated
        except Exception as exc:  # never let a connection take the loop's logger with it
            log.warning("corral-ray agent: a channel connection failed (%s)", type(exc).__name__)
        finally:
            if not authenticated:
                self._unauthenticated -= 1
            self._writers.discard(writer)
            writer.close()

    async def _reply_unless_abandoned(
        self, request: bytes, reader: asyncio.StreamReader
    ) -> bytes | None:
        """The reply; ``None`` when the client left (or spoke out of turn) first.

        A client that was cancelled mid-call closes its connection: the call
        is then cancelled here too (as ``ray.cancel`` does on the actor
        path), so e.g. a long command does not run on for nobody.
        """
        call = asyncio.ensure_future(self._reply(request))
        left = asyncio.ensure_future(reader.read(1))
        try:
            await asyncio.wait((call, left), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not call.done():
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await call
            if not left.done():
                left.cancel()
                # Only one read may wait on the stream: this one must be gone
                # before the next request is read.
                with contextlib.suppress(asyncio.CancelledError):
                    await left
        return call.result() if not call.cancelled() else None

    async def _reply(self, request: bytes) -> bytes:
        try:
            key, module, method, args, kwargs = decode_request(request)
        except CodecError:
            reply: Reply = (
                "err",
                "operation",
                "the request could not be decoded",
                "invalid_argument",
            )
        else:
            reply = await self._handle(key, module, method, args, kwargs)
        try:
            encoded = encode_message(reply)
        except NotEncodableError:
            log.warning("corral-ray agent: a reply had no channel encoding")
            encoded = encode_message(
                (
                    "err",
                    "operation",
                    "the workspace's node agent could not send the reply",
                    "failed",
                )
            )
        if len(encoded) > MAX_MESSAGE:
            encoded = encode_message(
                ("err", "operation", "the reply is too large for the node channel", "too_large")
            )
        return encoded


# ---------------------------------------------------------------------------
# the driver's side


@attrs.frozen
class Endpoint:
    """Where and how to reach one agent's channel (obtained through one Ray call).

    Attributes:
        host: The agent's node address.
        port: The agent's channel port.
        secret: The agent's random channel secret (never shown in ``repr``).
    """

    host: str
    port: int
    secret: bytes = attrs.field(repr=False)


@attrs.define(eq=False)
class _Conn:
    stream: anyio.abc.SocketStream
    reader: BufferedByteReceiveStream

    async def send(self, message: bytes) -> None:
        for frame in frames(message):
            await self.stream.send(frame)


async def _handshake(
    stream: anyio.abc.SocketStream, reader: BufferedByteReceiveStream, secret: bytes
) -> None:
    nonce = await read_message(reader.receive_exactly, limit=_NONCE_BYTES)
    await stream.send(frames(_proof(secret, nonce))[0])
    answer = await read_message(reader.receive_exactly, limit=_PROOF_LIMIT)
    if not hmac.compare_digest(answer, _confirmation(secret, nonce)):
        raise FrameError("no confirmation")


class _LoopKey:
    """One per event loop run: the key of that loop's connection pools."""

    __slots__ = ("__weakref__",)


# A RunVar lives exactly as long as its event loop run, on asyncio and trio alike,
# so the pools keyed by its value go with the loop (and no backend is imported here).
_LOOP_KEY: Final[anyio.lowlevel.RunVar[_LoopKey]] = anyio.lowlevel.RunVar("corral_ray_loop")


def _loop_key() -> _LoopKey:
    try:
        return _LOOP_KEY.get()
    except LookupError:
        key = _LoopKey()
        _LOOP_KEY.set(key)
        return key


class DirectClient:
    """The driver process's connections to agents: a small idle pool per event loop and agent.

    A call takes an idle connection (or makes one), sends the request and
    reads the reply; a connection that failed or was cancelled mid-call is
    closed, never reused. Connections belong to the event loop that made
    them, so each loop has its own pool.
    """

    def __init__(self) -> None:
        self._pools: weakref.WeakKeyDictionary[object, dict[Endpoint, list[_Conn]]] = (
            weakref.WeakKeyDictionary()
        )
        self._down: set[Endpoint] = set()
        self._holders: weakref.WeakKeyDictionary[object, dict[Endpoint, int]] = (
            weakref.WeakKeyDictionary()
        )

    def _pool(self, endpoint: Endpoint) -> list[_Conn]:
        return self._pools.setdefault(_loop_key(), {}).setdefault(endpoint, [])

    def is_down(self, endpoint: Endpoint) -> bool:
        """Whether a connection to the endpoint failed: its channels use the actor path."""
        return endpoint in self._down

    async def _connect(self, endpoint: Endpoint) -> _Conn:
        try:
            with anyio.fail_after(_CONNECT_S):
                stream = await anyio.connect_tcp(endpoint.host, endpoint.port)
                try:
                    reader = BufferedByteReceiveStream(stream)
                    await _handshake(stream, reader, endpoint.secret)
                except BaseException:
                    await anyio.aclose_forcefully(stream)
                    raise
        except (OSError, TimeoutError, anyio.EndOfStream, anyio.IncompleteRead, FrameError) as exc:
            self._down.add(endpoint)
            raise ChannelUnreachableError(type(exc).__name__) from None
        return _Conn(stream, reader)

    async def call(self, endpoint: Endpoint, request: bytes) -> bytes:
        """Send one request and return its reply's bytes.

        Raises:
            ChannelUnreachableError: No connection could be made (nothing was sent).
            ChannelBrokenError: The connection failed once the request was on its way.
        """
        if endpoint in self._down:
            raise ChannelUnreachableError("down")
        pool = self._pool(endpoint)
        conn = pool.pop() if pool else await self._connect(endpoint)
        try:
            await conn.send(request)
            reply = await read_message(conn.reader.receive_exactly)
        except BaseException as exc:
            await anyio.aclose_forcefully(conn.stream)
            if isinstance(
                exc,
                (
                    OSError,
                    anyio.EndOfStream,
                    anyio.IncompleteRead,
                    anyio.BrokenResourceError,
                    anyio.ClosedResourceError,
                    FrameError,
                ),
            ):
                raise ChannelBrokenError(type(exc).__name__) from None
            raise
        if len(pool) < _MAX_IDLE:
            pool.append(conn)
        else:
            await conn.stream.aclose()
        return reply

    def hold(self, endpoint: Endpoint) -> None:
        """A channel on this event loop uses the endpoint (see :meth:`release`)."""
        holders = self._holders.setdefault(_loop_key(), {})
        holders[endpoint] = holders.get(endpoint, 0) + 1

    async def release(self, endpoint: Endpoint) -> None:
        """A channel closed; close this loop's idle connections once no channel here holds them."""
        key = _loop_key()
        holders = self._holders.get(key, {})
        left = holders.get(endpoint, 1) - 1
        if left > 0:
            holders[endpoint] = left
            return
        holders.pop(endpoint, None)
        pools = self._pools.get(key)
        idle = pools.pop(endpoint, []) if pools is not None else []
        for conn in idle:
            await anyio.aclose_forcefully(conn.stream)


_CLIENT: Final = DirectClient()


def direct_client() -> DirectClient:
    """The process's channel client."""
    return _CLIENT
