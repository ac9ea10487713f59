"""The agents' direct channels on the real cluster: authentication, bounds, failures, fallback."""

from __future__ import annotations

import hashlib
import hmac
import logging
import socket
from typing import Any

import anyio
import pytest

from corral import ProviderConfig, SessionRef
from corral.provider import CommandRequest, OperationError, WorkspaceEvictedError
from corral_ray import RayProvider
from corral_ray import _provider as provider_module
from corral_ray._rpc import MAX_FRAME, Endpoint, direct_client, encode_request, frames
from corral_ray._wire import decode
from corral_ray.testing import LocalCluster, processes_matching

from .conftest import node_of, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.ray, pytest.mark.slow]
ONE_BACKEND = pytest.mark.parametrize("anyio_backend", ["asyncio"])
CONFIG = ProviderConfig(kind="ray")


def make(cluster: LocalCluster, **options: Any) -> RayProvider:
    options.setdefault("inner_options", {"tmpdir_root": str(cluster.root)})
    return RayProvider(address=cluster.address, **options)


def agent_endpoint(agent: str) -> dict[str, Any]:
    import ray

    handle: Any = ray.get_actor(agent, namespace="corral")
    reply: Any = ray.get(handle.endpoint.remote(), timeout=30)
    info: dict[str, Any] = decode(reply)
    return info


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        piece = sock.recv(n - len(data))
        if not piece:
            raise EOFError
        data += piece
    return data


def recv_frame(sock: socket.socket) -> bytes:
    header = recv_exactly(sock, 5)
    return recv_exactly(sock, int.from_bytes(header[:4], "big"))


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the agent closed the connection (nothing more arrives)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def channel_probe(info: dict[str, Any], secret: bytes, then: bytes | None) -> tuple[bool, bytes]:
    """Authenticate with ``secret``, send ``then``; returns (confirmed, what came back)."""
    with socket.create_connection((info["host"], info["port"]), timeout=20) as sock:
        nonce = recv_frame(sock)
        sock.sendall(frames(hmac.new(secret, nonce, hashlib.sha256).digest())[0])
        agent_side = hmac.new(info["secret"], b"corral-ray agent" + nonce, hashlib.sha256)
        try:
            confirmed = recv_frame(sock) == agent_side.digest()
        except (EOFError, ConnectionResetError):
            return False, b""
        if then is None:
            return confirmed, b""
        sock.sendall(then)
        try:
            return confirmed, recv_frame(sock)
        except (EOFError, ConnectionResetError):
            return confirmed, b""


@ONE_BACKEND
async def test_channel_refuses_wrong_secrets_and_oversized_frames(
    ray_cluster: LocalCluster,
) -> None:
    provider = make(ray_cluster, placement={"resource": "w1"})
    opened = await provider.open(CONFIG, SessionRef("channel-auth"))
    try:
        info = await anyio.to_thread.run_sync(agent_endpoint, opened.ref.payload["agent"])
        key = opened.ref.payload["workspace"]
        request = frames(encode_request(key, "fs", "stat", ("/",), {}))[0]
        # The right secret: confirmed, and a call answers.
        confirmed, reply = await anyio.to_thread.run_sync(
            channel_probe, info, info["secret"], request
        )
        assert confirmed
        assert b"ok" in reply
        # A wrong secret: closed without confirmation, the call never answered.
        confirmed, reply = await anyio.to_thread.run_sync(channel_probe, info, b"x" * 32, request)
        assert (confirmed, reply) == (False, b"")
        # An oversized frame after authenticating: the connection is dropped.
        oversized = (MAX_FRAME + 1).to_bytes(4, "big") + b"\0" + b"x" * 64
        confirmed, reply = await anyio.to_thread.run_sync(
            channel_probe, info, info["secret"], oversized
        )
        assert (confirmed, reply) == (True, b"")

        # Before authenticating, even the proof frame is bounded.
        def oversized_proof() -> bool:
            with socket.create_connection((info["host"], info["port"]), timeout=20) as sock:
                recv_frame(sock)
                sock.sendall((1 << 20).to_bytes(4, "big") + b"\0" + b"x" * 4096)
                return closed_by_peer(sock)

        assert await anyio.to_thread.run_sync(oversized_proof)
        # Garbage after authenticating: a fixed error, the input not echoed.
        confirmed, reply = await anyio.to_thread.run_sync(
            channel_probe, info, info["secret"], frames(b"\xc1SECRET-PAYLOAD")[0]
        )
        assert confirmed
        assert b"could not be decoded" in reply
        assert b"SECRET-PAYLOAD" not in reply
        # The workspace still works over the channel, which the calls really use.
        assert opened.workspace.fs is not None
        await opened.workspace.fs.write_file("/a.txt", b"abc")
        assert await opened.workspace.fs.read_file("/a.txt") == b"abc"
        endpoint = Endpoint(host=info["host"], port=info["port"], secret=info["secret"])
        assert direct_client()._pool(endpoint), "the call did not go over the channel"
    finally:
        await opened.workspace.close()


@ONE_BACKEND
async def test_unreachable_channel_falls_back_to_actor_calls(
    ray_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = provider_module._Cluster.endpoint
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]  # closed again: nothing listens there
    mode = ["refused"]
    handed: set[Endpoint] = set()

    async def sabotaged(self: Any, node_id: str, handle: Any) -> Endpoint | None:
        good = await real(self, node_id, handle)
        assert good is not None
        wrong = (
            Endpoint(host="127.0.0.1", port=free_port, secret=good.secret)
            if mode[0] == "refused"
            else Endpoint(host=good.host, port=good.port, secret=b"y" * 32)
        )
        handed.add(wrong)
        return wrong

    monkeypatch.setattr(provider_module._Cluster, "endpoint", sabotaged)
    caplog.set_level(logging.WARNING, logger="corral.ray")
    # Nothing listening, then a wrong secret: both fall back to Ray actor calls.
    for name in ("refused", "wrong-secret"):
        mode[0] = name
        provider = make(ray_cluster, placement={"resource": "w2"})
        opened = await provider.open(CONFIG, SessionRef(f"fallback-{name}"))
        try:
            assert opened.workspace.fs is not None
            await opened.workspace.fs.write_file("/b.txt", b"fallback")
            assert await opened.workspace.fs.read_file("/b.txt") == b"fallback"
        finally:
            await opened.workspace.close()
    assert len(handed) == 2
    assert all(direct_client().is_down(endpoint) for endpoint in handed)
    assert caplog.text.count("unreachable; using Ray actor calls") == 2


@ONE_BACKEND
async def test_agent_killed_mid_call_evicts_naming_the_node(ray_cluster: LocalCluster) -> None:
    import ray

    # Its own agents (distinct capacity), so killing them leaves the shared ones alone.
    provider = make(ray_cluster, placement={"resource": "w2"}, max_workspaces_per_node=93)
    opened = await provider.open(CONFIG, SessionRef("channel-kill"))
    node_id = node_of("w2")
    shell = opened.workspace.shell
    assert shell is not None
    marker = "9.3141593"
    caught: list[BaseException] = []

    async def long_command() -> None:
        try:
            await shell.run(CommandRequest(command=f"sleep {marker}", timeout_s=60))
        except (WorkspaceEvictedError, OperationError) as exc:
            caught.append(exc)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(long_command)
            await anyio.to_thread.run_sync(
                wait_for, lambda: processes_matching(f"sleep {marker}"), 30, "the command"
            )
            await anyio.sleep(0.5)  # the agent's watchdog has sampled it
            handle = await anyio.to_thread.run_sync(
                lambda: ray.get_actor(opened.ref.payload["agent"], namespace="corral")
            )
            await anyio.to_thread.run_sync(lambda: ray.kill(handle, no_restart=True))
        assert len(caught) == 1
        assert isinstance(caught[0], WorkspaceEvictedError)
        assert node_id in caught[0].message
        await anyio.to_thread.run_sync(
            wait_for, lambda: not processes_matching(f"sleep {marker}"), 15, "the command to die"
        )
    finally:
        await opened.workspace.close()


@ONE_BACKEND
async def test_cancelled_call_is_cancelled_on_the_agent(ray_cluster: LocalCluster) -> None:
    provider = make(ray_cluster, placement={"resource": "w1"})
    opened = await provider.open(CONFIG, SessionRef("channel-cancel"))
    shell = opened.workspace.shell
    assert shell is not None
    marker = "6.2831853"
    try:
        with anyio.move_on_after(60) as scope:
            async with anyio.create_task_group() as tg:

                async def long_command() -> None:
                    await shell.run(CommandRequest(command=f"sleep {marker}", timeout_s=60))

                tg.start_soon(long_command)
                await anyio.to_thread.run_sync(
                    wait_for, lambda: processes_matching(f"sleep {marker}"), 30, "the command"
                )
                tg.cancel_scope.cancel()
        assert not scope.cancelled_caught
        # The driver gave up: the agent cancelled the call, which killed the command.
        await anyio.to_thread.run_sync(
            wait_for, lambda: not processes_matching(f"sleep {marker}"), 5, "the command to die"
        )
    finally:
        await opened.workspace.close()
