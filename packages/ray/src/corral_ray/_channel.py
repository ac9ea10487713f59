"""The driver's side of one workspace: calls to its node agent, Ray failures mapped, leases kept.

A call goes over the agent's direct channel (:mod:`corral_ray._rpc`): one
socket round trip on the caller's event loop, about a millisecond cheaper
than a Ray actor call. It takes the actor path instead -- one actor method
call whose reply is awaited without blocking the event loop (natively on
asyncio, in a worker thread on trio), contents above Ray's inline limit
through the object store -- when the agent has no channel, when no
authenticated connection to it can be made (e.g. a firewall between the
nodes; the endpoint is then marked down for the process), or when the
call's arguments are outside the channel's closed set of types (a compiled
grep matcher).

A dead agent or node becomes :class:`WorkspaceEvictedError` naming the
node: on the actor path Ray says so; on the channel a connection that
breaks mid-call makes the driver ask Ray whether the agent still answers.
The tool layer then re-resolves, and resolve tells a lost node (failed)
from a restarted agent (re-attached).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from typing import Any, Final

import anyio

from corral.provider import OperationError, WorkspaceEvictedError, workspace_closed

from ._rpc import (
    MAX_MESSAGE,
    ChannelBrokenError,
    ChannelUnreachableError,
    CodecError,
    Endpoint,
    NotEncodableError,
    decode_message,
    direct_client,
    encode_request,
)
from ._wire import PROVIDER_ID, decode

__all__ = ["Channel", "await_ref", "lease_keeper", "unreachable"]

log = logging.getLogger("corral.ray")

_PING_S: Final = 10.0


def _ray_errors() -> tuple[type[BaseException], ...]:
    import ray.exceptions as rex

    return (
        rex.RayActorError,
        rex.ActorUnavailableError,
        rex.ObjectLostError,
        rex.GetTimeoutError,
        rex.RaySystemError,
        rex.RayTaskError,
    )


def unreachable(exc: BaseException) -> bool:
    """Whether an error means the agent (or its node) did not answer: Ray failures, timeouts."""
    return isinstance(exc, (TimeoutError, *_ray_errors()))


async def await_ref(ref: Any) -> Any:
    """The value of a Ray ObjectRef, without blocking the event loop; cancels the task on cancel."""
    import ray

    try:
        if _on_asyncio():
            return await ref
        return await anyio.to_thread.run_sync(ray.get, ref, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        try:
            ray.cancel(ref)
        except Exception as exc:  # the caller's cancellation matters more
            log.debug("corral-ray: cancelling a call failed (%s)", type(exc).__name__)
        raise


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Channel:
    """Calls to one workspace on its node agent.

    Args:
        handle: The agent's actor handle.
        key: The workspace's key in the agent's table.
        node_id: The node, for messages.
        agent: The agent's name, for lease renewal grouping.
        direct: The agent's channel endpoint; ``None``: actor calls only.
    """

    def __init__(
        self, handle: Any, key: str, node_id: str, agent: str, direct: Endpoint | None = None
    ) -> None:
        self.handle = handle
        self.key = key
        self.node_id = node_id
        self.agent = agent
        self.direct = direct
        self.closed = False

    def lost(self) -> WorkspaceEvictedError:
        """The error for a call whose agent or node stopped answering."""
        return WorkspaceEvictedError(
            f"{PROVIDER_ID}: the agent hosting the workspace on node {self.node_id} "
            "stopped answering (the node or its agent is gone)",
            provider_id=PROVIDER_ID,
        )

    async def call(self, module: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``module.method(*args, **kwargs)`` on the agent; errors rebuilt as the agent raised them.

        Raises:
            OperationError: As the inner module raised it; ``closed`` after close.
            WorkspaceEvictedError: The agent or its node is gone.
            WorkspaceFailedError: The agent no longer hosts the workspace.
        """
        if self.closed:
            raise workspace_closed()
        direct = self.direct
        if direct is not None and not direct_client().is_down(direct):
            try:
                request: bytes | None = encode_request(self.key, module, method, args, kwargs)
            except NotEncodableError:
                request = None
            if request is not None and len(request) <= MAX_MESSAGE:
                try:
                    raw = await direct_client().call(direct, request)
                except ChannelUnreachableError:
                    log.warning(
                        "corral-ray: the channel of the agent on node %s is unreachable; "
                        "using Ray actor calls",
                        self.node_id,
                    )
                except ChannelBrokenError:
                    raise await self._broken() from None
                else:
                    try:
                        reply = decode_message(raw)
                    except CodecError:
                        raise OperationError(
                            f"{PROVIDER_ID}: the reply of the node agent could not be decoded",
                            code="failed",
                        ) from None
                    return decode(reply)
        try:
            reply = await await_ref(self.handle.call.remote(self.key, module, method, args, kwargs))
        except Exception as exc:
            if unreachable(exc):
                raise self.lost() from exc
            raise
        return decode(reply)

    async def _broken(self) -> Exception:
        """The error for a call whose channel connection broke: is the agent still there?"""
        try:
            with anyio.fail_after(_PING_S):
                decode(await await_ref(self.handle.ping.remote()))
        except Exception as exc:
            if unreachable(exc):
                return self.lost()
            raise
        return OperationError(
            f"{PROVIDER_ID}: the connection to the node agent on node {self.node_id} broke "
            "during the call; it may or may not have taken effect",
            code="failed",
        )


class _LeaseKeeper:
    """One daemon thread per driver process renewing the leases of its live workspaces.

    Process-wide infrastructure, not per-session state: it only holds weak
    references to live channels, grouped by agent, and tells each agent
    "these are still in use" every third of the shortest lease.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: weakref.WeakSet[Channel] = weakref.WeakSet()
        self._period = 30.0
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def add(self, channel: Channel, lease_s: float) -> None:
        """Keep a channel's workspace leased while the channel is open."""
        with self._lock:
            self._channels.add(channel)
            if lease_s / 3 < self._period:
                self._period = max(0.05, lease_s / 3)
                self._wake.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="corral-ray-leases", daemon=True
                )
                self._thread.start()

    def discard(self, channel: Channel) -> None:
        """Stop renewing a channel's lease (its workspace was closed)."""
        with self._lock:
            self._channels.discard(channel)

    def _run(self) -> None:
        import ray

        while True:
            self._wake.wait(self._period)
            self._wake.clear()
            with self._lock:
                groups: dict[str, tuple[Any, list[str]]] = {}
                for channel in list(self._channels):
                    if not channel.closed:
                        groups.setdefault(channel.agent, (channel.handle, []))[1].append(
                            channel.key
                        )
            deadline = time.monotonic() + max(self._period, 1.0)
            try:
                refs = [handle.renew.remote(keys) for handle, keys in groups.values()]
                for ref in refs:
                    ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                # A dead agent is seen by the next call; a driver that shut Ray
                # down has nothing left to renew. Never let the thread die.
                log.debug("corral-ray: lease renewal failed (%s)", type(exc).__name__)


_KEEPER: Final = _LeaseKeeper()


def lease_keeper() -> _LeaseKeeper:
    """The process's lease keeper."""
    return _KEEPER
