"""The node agent: one detached, named Ray actor per node that hosts its workspaces.

The agent holds the node's live inner workspaces (opened or re-attached
through the inner provider, e.g. local-bash) in a table keyed by the inner
workspace id, and serves module calls on them. It is a Ray *async* actor, so
every call runs on the actor's asyncio loop, which is what the inner
providers' anyio code runs on.

Why the table and the lease: a driver process can die without closing its
workspaces. Every live session renews a lease on each workspace it uses
(each call renews it too); the agent closes -- and so kills the process
groups of, and deletes -- a workspace whose lease ran out. A workspace
another driver resolves within the lease is the same live object, so two
drivers never hold two inner instances of one workspace.

No exception ever leaves a method: replies are tuples (see ``_wire``), so
no pickled traceback with host paths or environment values crosses the
boundary.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from corral.provider import (
    CodeInterpreter,
    FileSystem,
    ProviderConfig,
    SessionRef,
    Shell,
    Snapshotter,
    Versions,
    Workspace,
    WorkspaceFailedError,
    WorkspaceProvider,
    WorkspaceRef,
    describe_workspace,
)

from ._rpc import AgentServer
from ._wire import PROVIDER_ID, Reply, encode_error, full, ok

__all__ = ["AgentSpec", "NodeAgent", "describe_modules"]

log = logging.getLogger("corral.ray.agent")

_BUILTIN_MODULES: Final = ("fs", "shell", "code", "script", "snapshot")
_EXTRA_MODULES: Final = ("process",)
_TOMBSTONES: Final = 4096


@attrs.frozen(kw_only=True)
class AgentSpec:
    """What an agent is built with; part of its name's hash, so equal specs share an agent.

    Attributes:
        inner_kind: The inner provider kind (``local-bash``, ``local-sandbox``, ``docker``).
        inner_options: The inner provider's factory options (JSON values).
        max_workspaces: Live workspaces the agent hosts at most.
        min_free_memory_bytes: An open is refused while the node has less available memory.
    """

    inner_kind: str
    inner_options: Mapping[str, Any]
    max_workspaces: int
    min_free_memory_bytes: int


@attrs.define
class _Hosted:
    workspace: Workspace
    inner_ref: Mapping[str, Any]
    lease_s: float
    expires: float


def describe_modules(ws: Workspace, names: Sequence[str]) -> dict[str, Any]:
    """Which modules a workspace has and how the driver must proxy each.

    Returns:
        ``{"modules": {name: kind}, "languages": {name: [...]}, "details": {...}}``
        where kind is ``fs``, ``shell``, ``snapshot``, ``versions``, ``code``
        or ``generic`` (forwarded method by method).
    """
    modules: dict[str, str] = {}
    languages: dict[str, list[str]] = {}
    for name in dict.fromkeys([*_BUILTIN_MODULES, *_EXTRA_MODULES, *names]):
        module = ws.module(name)
        if module is None:
            continue
        if name == "fs" and isinstance(module, FileSystem):
            modules[name] = "fs"
        elif name == "shell" and isinstance(module, Shell):
            modules[name] = "shell"
        elif name == "snapshot" and isinstance(module, Versions):
            modules[name] = "versions"
        elif name == "snapshot" and isinstance(module, Snapshotter):
            modules[name] = "snapshot"
        elif isinstance(module, CodeInterpreter):
            modules[name] = "code"
            languages[name] = sorted(module.languages)
        else:
            modules[name] = "generic"
    return {"modules": modules, "languages": languages, "details": dict(describe_workspace(ws))}


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _same_workspace(ws: Workspace, key: str) -> None:
    if ws.id != key:
        raise WorkspaceFailedError(
            f"{PROVIDER_ID}: workspace ref is malformed", provider_id=PROVIDER_ID
        )


def _same_ref(given: WorkspaceRef, hosted: WorkspaceRef) -> None:
    if (
        given.provider_id != hosted.provider_id
        or dict(given.payload) != dict(hosted.payload)
        or given.capabilities != hosted.capabilities
    ):
        raise WorkspaceFailedError(
            f"{PROVIDER_ID}: workspace ref is malformed", provider_id=PROVIDER_ID
        )


def _method(ws: Workspace, module: str, method: str) -> Any:
    target = ws.module(module)
    if target is None or method.startswith("_") or not callable(getattr(target, method, None)):
        raise WorkspaceFailedError(
            f"{PROVIDER_ID}: the workspace has no such module method", provider_id=PROVIDER_ID
        )
    return getattr(target, method)


class NodeAgent:
    """Hosts one node's workspaces through the inner provider (wrapped by ``ray.remote``).

    Args:
        spec: The inner provider and the node's capacity.
    """

    def __init__(self, spec: AgentSpec) -> None:
        self._spec = spec
        self._provider: WorkspaceProvider | None = None
        self._live: dict[str, _Hosted] = {}
        self._gone: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._opening = 0
        self._reaper: asyncio.Task[None] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._reap_every = 1.0
        self._server: AgentServer | None = None
        self._server_lock: asyncio.Lock | None = None

    def _inner(self) -> WorkspaceProvider:
        if self._provider is None:
            import corral

            spec = corral.load_plugins().provider(self._spec.inner_kind)
            self._provider = spec.create(self._spec.inner_options)
        return self._provider

    def _start(self, lease_s: float) -> None:
        # The reaper runs as often as the shortest lease asks, within bounds.
        self._reap_every = max(0.1, min(self._reap_every, lease_s / 4))
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_loop())

    def _start_watchdog(self) -> None:
        # Holds the pipe's write end: the watchdog sees end of file when this
        # process dies, however it dies (see ``_watchdog``).
        # Run by path, not ``-m``: only the standard library loads, so it is
        # watching within a fraction of a second.
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_watchdog.py")
        self._watchdog = subprocess.Popen(
            [sys.executable, "-I", script, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )

    async def _reap_loop(self) -> None:
        try:
            await asyncio.to_thread(self._start_watchdog)
        except OSError as exc:
            log.warning("corral-ray agent: no watchdog (%s)", type(exc).__name__)
        while True:
            await asyncio.sleep(self._reap_every)
            now = time.monotonic()
            for key in [k for k, h in self._live.items() if h.expires <= now]:
                hosted = self._live.pop(key, None)
                if hosted is None or hosted.expires > now:
                    continue
                self._bury(key, "its lease expired (no live session renewed it)")
                log.info("corral-ray agent: collecting a workspace whose lease expired")
                await self._close_quietly(hosted.workspace)

    def _bury(self, key: str, reason: str) -> None:
        self._gone[key] = reason
        while len(self._gone) > _TOMBSTONES:
            self._gone.popitem(last=False)

    @staticmethod
    async def _close_quietly(ws: Workspace) -> None:
        try:
            await ws.close()
        except Exception as exc:
            log.warning("corral-ray agent: closing a workspace failed (%s)", type(exc).__name__)

    def _hosted(self, key: str) -> _Hosted:
        hosted = self._live.get(key)
        if hosted is None:
            reason = self._gone.get(key, "it is not hosted by this node's agent")
            raise WorkspaceFailedError(
                f"{PROVIDER_ID}: the workspace is gone: {reason}", provider_id=PROVIDER_ID
            )
        hosted.expires = time.monotonic() + hosted.lease_s
        return hosted

    async def ping(self) -> Reply:
        """The agent's node, process and load; also proves the agent is up."""
        import ray

        return ok(
            {
                "node_id": ray.get_runtime_context().get_node_id(),
                "pid": os.getpid(),
                "workspaces": len(self._live) + self._opening,
                "max_workspaces": self._spec.max_workspaces,
            }
        )

    async def endpoint(self) -> Reply:
        """The agent's direct channel: ``{"host", "port", "secret"}``, started on first use.

        The server listens on the node's address, on this actor's event loop
        (calls run where the workspaces live, without Ray's thread hop). The
        secret only leaves the agent through this Ray call.
        """
        import ray

        if self._server_lock is None:
            self._server_lock = asyncio.Lock()
        try:
            async with self._server_lock:
                if self._server is None:
                    server = AgentServer(self.call)
                    await server.start(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
                    self._server = server
            host, port = self._server.address or ("", 0)
            return ok({"host": host, "port": port, "secret": self._server.secret})
        except Exception as exc:
            return encode_error(exc)

    async def open(
        self,
        options: Mapping[str, Any],
        session: SessionRef,
        declared: frozenset[str],
        lease_s: float,
    ) -> Reply:
        """Open an inner workspace if the node has room.

        Returns:
            ``(key, inner ref dict, module description)``, a ``full`` reply, or an error.
        """
        from corral import ref_to_dict

        self._start(lease_s)
        if len(self._live) + self._opening >= self._spec.max_workspaces:
            return full(f"{PROVIDER_ID}: the node hosts its maximum of workspaces")
        self._opening += 1
        try:
            floor = self._spec.min_free_memory_bytes
            if floor > 0:
                free = await asyncio.to_thread(_available_memory)
                if free is not None and free < floor:
                    return full(f"{PROVIDER_ID}: the node is short of memory")
            opened = await self._inner().open(
                ProviderConfig(kind=self._spec.inner_kind, options=options), session, declared
            )
            ws = opened.workspace
            inner_ref = ref_to_dict(opened.ref)
            self._live[ws.id] = _Hosted(ws, inner_ref, lease_s, time.monotonic() + lease_s)
            return ok((ws.id, inner_ref, describe_modules(ws, sorted(opened.ref.capabilities))))
        except Exception as exc:
            return encode_error(exc)
        finally:
            self._opening -= 1

    async def attach(self, key: str, inner_ref: Mapping[str, Any], lease_s: float) -> Reply:
        """Find a hosted workspace, or re-attach it through the inner provider.

        Re-attaching happens after this agent was restarted on a node whose
        storage survived. A workspace that was closed or collected is gone.

        Returns:
            The module description, or an error.
        """
        from corral import ref_from_dict

        self._start(lease_s)
        try:
            ref = ref_from_dict(inner_ref)
            hosted = self._live.get(key)
            if hosted is not None:
                # The live workspace answers only to its own ref, never a doctored one.
                _same_ref(ref, ref_from_dict(hosted.inner_ref))
            else:
                if key in self._gone:
                    self._hosted(key)  # raises, with the reason
                ws = await self._inner().resolve(ref)
                # Someone else's workspace under a forged key is refused, never
                # closed (close deletes its data): this handle is just dropped.
                _same_workspace(ws, key)
                # Another attach may have won the race while this one resolved.
                hosted = self._live.setdefault(
                    key, _Hosted(ws, dict(inner_ref), lease_s, time.monotonic() + lease_s)
                )
            hosted.lease_s = max(hosted.lease_s, lease_s)
            hosted.expires = time.monotonic() + hosted.lease_s
            return ok(
                describe_modules(hosted.workspace, sorted(hosted.inner_ref.get("capabilities", ())))
            )
        except Exception as exc:
            return encode_error(exc)

    async def call(
        self, key: str, module: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Reply:
        """Call ``module.method(*args, **kwargs)`` on a hosted workspace (renews its lease)."""
        from corral import ref_to_dict

        try:
            hosted = self._hosted(key)
            value = await _method(hosted.workspace, module, method)(*args, **kwargs)
            if isinstance(value, WorkspaceRef):
                # restore/branch hand back an inner ref; the driver wraps it with its key.
                return ok(await self._adopt(key, hosted, ref_to_dict(value)))
            return ok(value)
        except Exception as exc:
            return encode_error(exc)

    async def _adopt(
        self, key: str, hosted: _Hosted, inner_ref: dict[str, Any]
    ) -> tuple[str, dict[str, Any], str]:
        """Host the workspace an inner ref names (a branch), or update this one's ref."""
        from corral import ref_from_dict

        ws = await self._inner().resolve(ref_from_dict(inner_ref))
        if ws.id == key:
            hosted.inner_ref = inner_ref
            if ws is not hosted.workspace:
                # A second handle on the same storage: drop it, never close it
                # (close would delete the very workspace the caller holds).
                del ws
            return ("inner-ref", inner_ref, key)
        # A branch: hosted under the same lease rules until a session attaches it.
        self._live.setdefault(
            ws.id, _Hosted(ws, inner_ref, hosted.lease_s, time.monotonic() + hosted.lease_s)
        )
        return ("inner-ref", inner_ref, ws.id)

    async def renew(self, keys: Sequence[str]) -> Reply:
        """Renew the leases of workspaces a live session holds; returns the keys gone."""
        now = time.monotonic()
        gone = []
        for key in keys:
            hosted = self._live.get(key)
            if hosted is None:
                gone.append(key)
            else:
                hosted.expires = now + hosted.lease_s
        return ok(gone)

    async def close(self, key: str) -> Reply:
        """Close (and delete) a hosted workspace; closing one already gone is fine."""
        hosted = self._live.pop(key, None)
        if hosted is None:
            return ok(None)
        self._bury(key, "it was closed")
        try:
            await hosted.workspace.close()
        except Exception as exc:
            return encode_error(exc)
        return ok(None)

    async def shutdown(self) -> Reply:
        """Close every hosted workspace, killing their process groups; the caller then kills us.

        ``ray.kill`` of the actor alone would leave the workspaces' commands
        running: teardown calls this first (see ``corral_ray.shutdown_agents``).
        """
        if self._reaper is not None:
            self._reaper.cancel()
        if self._server is not None:
            self._server.close()
        hosted = list(self._live.values())
        self._live.clear()
        for item in hosted:
            await self._close_quietly(item.workspace)
        return ok(len(hosted))
