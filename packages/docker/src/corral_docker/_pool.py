"""A small pool of pre-started containers, adopted at open (local engines).

Container start is most of what ``open`` costs. With ``pool_size=N`` the
provider keeps N workspaces ready: a host directory plus a started, hardened
container bind-mounting it, built with the provider's default options. An
``open`` whose options equal those defaults adopts one instead of starting
a container, and a background thread (with its own event loop, so it works
under asyncio and trio alike) starts the replacement. Members hold no
session data until adopted, so sharing the pool across sessions is safe.
Members left behind by a crash are removed by ``corral docker gc`` (their
owner process is dead).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable

import anyio
import attrs

__all__ = ["ContainerPool", "PoolMember"]

log = logging.getLogger("corral.docker.pool")


@attrs.frozen
class PoolMember:
    """A ready workspace: its directory name and its running container."""

    workspace: str
    container_id: str


class ContainerPool:
    """Keeps up to ``size`` members ready, refilled from a background thread.

    Args:
        size: How many members to keep ready.
        make: Creates one member (workspace directory and started container).
        discard: Removes a member that was never adopted.
    """

    def __init__(
        self,
        size: int,
        make: Callable[[], Awaitable[PoolMember]],
        discard: Callable[[PoolMember], Awaitable[None]],
    ) -> None:
        self._size = size
        self._make = make
        self._discard = discard
        self._ready: collections.deque[PoolMember] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._failures = 0
        self._thread: threading.Thread | None = None

    @property
    def ready(self) -> int:
        """Members ready for adoption."""
        with self._lock:
            return len(self._ready)

    def start(self) -> None:
        """Start filling the pool in the background (idempotent)."""
        with self._lock:
            if self._thread is not None or self._size <= 0:
                return
            self._thread = threading.Thread(
                target=self._loop, name="corral-docker-pool", daemon=True
            )
            self._thread.start()
        self._wake.set()

    def take(self) -> PoolMember | None:
        """Adopt a ready member, or None; triggers a refill."""
        with self._lock:
            member = self._ready.popleft() if self._ready else None
        self._wake.set()
        return member

    async def wait_ready(self, count: int, *, timeout_s: float) -> bool:
        """Wait until ``count`` members are ready (for warm-up and tests)."""
        with anyio.move_on_after(timeout_s):
            # Members are added by the pool's own thread and event loop, so an
            # anyio.Event (bound to one loop) cannot signal us; poll instead.
            while self.ready < count:  # noqa: ASYNC110
                await anyio.sleep(0.05)
            return True
        return False

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopped:
                return
            try:
                anyio.run(self._fill)
            except Exception:
                log.exception("docker pool: refill failed")

    async def _fill(self) -> None:
        while not self._stopped:
            with self._lock:
                if len(self._ready) >= self._size:
                    return
            try:
                member = await self._make()
            except Exception:
                self._failures += 1
                log.warning("docker pool: could not start a container", exc_info=True)
                # Back off instead of hammering a failing daemon; open still works.
                await anyio.sleep(min(30.0, 0.5 * 2**self._failures))
                continue
            self._failures = 0
            if not self._offer(member):
                await self._discard(member)

    def _offer(self, member: PoolMember) -> bool:
        with self._lock:
            if self._stopped:
                return False
            self._ready.append(member)
            return True

    async def aclose(self) -> None:
        """Stop refilling and remove every member that was not adopted."""
        with self._lock:
            self._stopped = True
            members = list(self._ready)
            self._ready.clear()
            thread = self._thread
        self._wake.set()
        for member in members:
            with contextlib.suppress(Exception):
                await self._discard(member)
        if thread is not None:
            await anyio.to_thread.run_sync(thread.join, 30.0)
            # A member created while we stopped was discarded by the thread itself.
