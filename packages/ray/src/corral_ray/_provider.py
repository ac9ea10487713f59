"""The ``ray`` provider: workspaces of an inner provider, placed on the nodes of a Ray cluster.

Open picks a node by the placement policy, finds (or starts) that node's
agent -- a detached actor named after the node and the provider's
configuration, in namespace ``corral`` -- and asks it to open an inner
workspace. The ref is a plain descriptor: the cluster's GCS address, the
node id, the agent's name and the inner ref. Any driver attached to the same
cluster resolves it, also after the driver that opened it died (within the
workspace's lease). A ref is untrusted: resolve never connects to an
address it names and only talks to the agent this provider's own
configuration would use on that node.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Mapping
from typing import Any, Final

import anyio
import attrs

from corral.provider import (
    BuildContext,
    ConfigError,
    Modules,
    OpenedWorkspace,
    OperationError,
    ProviderConfig,
    SessionRef,
    Workspace,
    WorkspaceAssembly,
    WorkspaceFailedError,
    WorkspaceRef,
)

from ._agent import NodeAgent
from ._channel import Channel, await_ref, lease_keeper, unreachable
from ._options import RayOptions, agent_name
from ._proxy import (
    CodeProxy,
    FileSystemProxy,
    GenericProxy,
    ShellProxy,
    SnapshotProxy,
    VersionsProxy,
)
from ._rpc import Endpoint, direct_client
from ._wire import PROVIDER_ID, decode

__all__ = ["NAMESPACE", "SCHEMA_VERSION", "RayProvider", "RayRefPayload", "shutdown_agents"]

log = logging.getLogger("corral.ray")

SCHEMA_VERSION: Final = 1
NAMESPACE: Final = "corral"
_NODE_TTL_S: Final = 1.0

_HEX56 = attrs.validators.matches_re(r"[0-9a-f]{56}")


@attrs.frozen
class RayRefPayload:
    """The ref payload: a plain descriptor of where the workspace lives.

    Attributes:
        workspace: The inner workspace's id (the agent's key).
        cluster: The GCS address of the cluster that holds it.
        node_id: The Ray node whose agent hosts it.
        agent: The agent's actor name.
        inner: The inner provider's ref, as a JSON object.
    """

    workspace: str = attrs.field(
        validator=attrs.validators.and_(
            attrs.validators.instance_of(str), attrs.validators.max_len(300)
        )
    )
    cluster: str = attrs.field(validator=attrs.validators.matches_re(r"[A-Za-z0-9.:\[\]_-]{1,300}"))
    node_id: str = attrs.field(validator=_HEX56)
    agent: str = attrs.field(
        validator=attrs.validators.matches_re(r"corral-agent-[0-9a-f]{12}-[0-9a-f]{56}")
    )
    inner: dict[str, Any] = attrs.field(validator=attrs.validators.instance_of(dict))

    def __attrs_post_init__(self) -> None:
        if not self.workspace or not re.fullmatch(r"[\x21-\x7e]+", self.workspace):
            raise ValueError("workspace key")


@attrs.frozen
class _Opening:
    handle: Any
    description: Mapping[str, Any]


class _Cluster:
    """Process-wide Ray plumbing of one provider: connection, node list, agent handles."""

    def __init__(self, options: RayOptions) -> None:
        self._options = options
        self._tag = options.agent_tag()
        self._nodes: list[dict[str, Any]] = []
        self._nodes_at = -1e9
        self._agents: dict[str, Any] = {}
        self._endpoints: dict[str, tuple[Any, Endpoint | None]] = {}
        self.gcs_address = ""
        self.pending: dict[str, int] = {}
        """Opens in flight from this process, by node (placement counts them)."""

    async def connect(self) -> None:
        """Attach this process to the cluster (once), in a worker thread."""
        if self.gcs_address:
            return
        self.gcs_address = await anyio.to_thread.run_sync(self._connect_blocking)

    def _connect_blocking(self) -> str:
        import ray

        if not ray.is_initialized():
            try:
                ray.init(
                    address=self._options.address,
                    namespace=NAMESPACE,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                    configure_logging=False,
                )
            except Exception as exc:
                raise WorkspaceFailedError(
                    f"{PROVIDER_ID}: cannot attach to the Ray cluster at the configured address "
                    f"({type(exc).__name__})",
                    provider_id=PROVIDER_ID,
                    transient=True,
                ) from None
        address: str = ray.get_runtime_context().gcs_address
        return address

    async def nodes(self, *, fresh: bool = False) -> list[dict[str, Any]]:
        """Alive and dead nodes (``ray.nodes()``), cached for a second unless ``fresh``."""
        if fresh or time.monotonic() - self._nodes_at > _NODE_TTL_S:
            import ray

            self._nodes = await anyio.to_thread.run_sync(ray.nodes)
            self._nodes_at = time.monotonic()
        return self._nodes

    def agent_name(self, node_id: str) -> str:
        """The agent this configuration uses on a node."""
        return agent_name(self._tag, node_id)

    async def agent(self, node_id: str) -> Any:
        """The handle of a node's agent, started (pinned to the node) when missing."""
        handle = self._agents.get(node_id)
        if handle is None:
            handle = await anyio.to_thread.run_sync(self._agent_blocking, node_id)
            self._agents[node_id] = handle
        return handle

    def _agent_blocking(self, node_id: str) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = ray.remote(NodeAgent)
        return actor.options(
            name=self.agent_name(node_id),
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_concurrency=10_000,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(self._options.agent_spec())

    async def endpoint(self, node_id: str, handle: Any) -> Endpoint | None:
        """The direct channel of a node's agent (one Ray call per agent, then cached).

        ``None`` when the agent has no channel: its workspaces use actor calls.
        """
        cached = self._endpoints.get(node_id)
        if cached is not None and cached[0] is handle:
            return cached[1]
        try:
            with anyio.fail_after(self._options.open_timeout_s):
                reply = await await_ref(handle.endpoint.remote())
        except Exception as exc:
            if not unreachable(exc):
                raise
            # Not cached: the next workspace on this agent asks again.
            log.warning("corral-ray: the agent on node %s did not give its channel", node_id)
            return None
        endpoint: Endpoint | None = None
        try:
            info = decode(reply)
            if not isinstance(info["secret"], bytes) or len(info["secret"]) < 16:
                raise TypeError("secret")  # noqa: TRY301 -- one path for every malformed reply
            endpoint = Endpoint(
                host=str(info["host"]), port=int(info["port"]), secret=info["secret"]
            )
        except (OperationError, WorkspaceFailedError, KeyError, TypeError, ValueError) as exc:
            # The agent cannot serve a channel: remembered, its workspaces use actor calls.
            log.warning(
                "corral-ray: the agent on node %s has no channel (%s); using Ray actor calls",
                node_id,
                type(exc).__name__,
            )
        self._endpoints[node_id] = (handle, endpoint)
        return endpoint

    def forget(self, node_id: str) -> None:
        """Drop a cached agent handle (its agent died); the next use looks it up again."""
        self._agents.pop(node_id, None)
        self._endpoints.pop(node_id, None)


class RayProvider:
    """Workspaces of an inner provider, hosted by one agent per node of a Ray cluster.

    Args:
        inner: The inner provider kind: ``local-bash``, ``local-sandbox`` or ``docker``.
        inner_options: The inner provider's factory options (JSON values),
            checked here by the inner provider itself and used by every agent.
        placement: ``"spread"`` (default), ``"pack"``, or
            ``{"strategy": ..., "resource": NAME, "labels": {...}}`` to
            require a custom resource (``ray start --resources``) or node labels.
        address: The Ray cluster to attach to when this process is not yet
            attached (``auto``: the running cluster).
        max_workspaces_per_node: Live workspaces one agent hosts at most.
        min_free_memory_bytes: An agent refuses opens while its node has
            less memory available (0: no check).
        open_timeout_s: How long an open waits for a node with room (and a
            resolve for the node's agent) before a transient failure.
        lease_s: A workspace no live session renewed for this long is closed
            and deleted by its agent (a driver that died leaves no orphans).

    Raises:
        ConfigError: A bad option, or the inner provider refuses its options.
    """

    def __init__(
        self,
        *,
        inner: str = "local-bash",
        inner_options: Mapping[str, Any] | None = None,
        placement: str | Mapping[str, Any] = "spread",
        address: str = "auto",
        max_workspaces_per_node: int = 256,
        min_free_memory_bytes: int = 0,
        open_timeout_s: float = 60.0,
        lease_s: float = 600.0,
    ) -> None:
        self._options = RayOptions.parse(
            inner=inner,
            inner_options=inner_options,
            placement=placement,
            address=address,
            max_workspaces_per_node=max_workspaces_per_node,
            min_free_memory_bytes=min_free_memory_bytes,
            open_timeout_s=open_timeout_s,
            lease_s=lease_s,
        )
        import corral

        spec = corral.load_plugins().provider(self._options.inner)
        try:
            # The inner provider checks its own options here, as every agent will.
            inner_provider = spec.create(self._options.inner_options)
        except ConfigError as exc:
            raise ConfigError(f"ray provider option inner_options: {exc}") from None
        self._capabilities = frozenset(inner_provider.capabilities)
        self._cluster = _Cluster(self._options)
        self._assembly = WorkspaceAssembly(
            _RayBuilder(self._options, self._cluster),
            provider_id=PROVIDER_ID,
            capabilities=self._capabilities,
            schema_version=SCHEMA_VERSION,
            payload_type=RayRefPayload,
        )

    @property
    def provider_id(self) -> str:
        """Always ``ray``."""
        return PROVIDER_ID

    @property
    def capabilities(self) -> frozenset[str]:
        """The inner provider's capabilities."""
        return self._capabilities

    @property
    def schema_version(self) -> int:
        """The current ref payload version."""
        return SCHEMA_VERSION

    @property
    def options(self) -> RayOptions:
        """The validated options."""
        return self._options

    async def open(
        self,
        config: ProviderConfig,
        session: SessionRef,
        declared: frozenset[str] | None = None,
    ) -> OpenedWorkspace:
        """Place a new workspace on a node and open it there through its agent.

        ``config.options`` are the inner provider's per-session options.

        Raises:
            WorkspaceFailedError: Bad per-session options (as the inner
                provider says), or no node with room matched the placement
                within ``open_timeout_s`` (``transient=True``).
        """
        return await self._assembly.open(config, session, declared)

    async def resolve(self, ref: WorkspaceRef) -> Workspace:
        """Re-attach a workspace through the agent of the node its ref names.

        Raises:
            WorkspaceFailedError: Foreign or malformed ref, another cluster,
                another configuration, a node that is gone (named), or a
                workspace that was closed or collected.
        """
        if not isinstance(ref, WorkspaceRef):
            raise WorkspaceFailedError("workspace ref is malformed", provider_id=PROVIDER_ID)
        return await self._assembly.resolve(ref)

    async def shutdown_agents(self) -> int:
        """Tear down this configuration's agents: close their workspaces, then kill them.

        Returns:
            How many workspaces were closed.
        """
        await self._cluster.connect()
        return await anyio.to_thread.run_sync(_shutdown_blocking, self._options.agent_tag())

    def __repr__(self) -> str:
        return f"RayProvider(inner={self._options.inner!r})"


def shutdown_agents(tag: str | None = None) -> int:
    """Tear down corral's agents on the cluster this process is attached to (blocking).

    Each agent first closes its workspaces, which kills their process
    groups, and is then killed: ``ray.kill`` alone would leave their
    commands running.

    Args:
        tag: Only the agents of one configuration (``RayOptions.agent_tag()``).

    Returns:
        How many workspaces were closed.
    """
    return _shutdown_blocking(tag)


def _shutdown_blocking(tag: str | None) -> int:
    import ray
    from ray.util import list_named_actors

    prefix = f"corral-agent-{tag}-" if tag else "corral-agent-"
    closed = 0
    for entry in list_named_actors(all_namespaces=True):
        if entry.get("namespace") != NAMESPACE or not entry.get("name", "").startswith(prefix):
            continue
        try:
            handle: Any = ray.get_actor(entry["name"], namespace=NAMESPACE)
            reply: Any = ray.get(handle.shutdown.remote(), timeout=60)
            closed += int(decode(reply))
            ray.kill(handle)
        except Exception as exc:
            log.warning("corral-ray: tearing down an agent failed (%s)", type(exc).__name__)
    return closed


class _RayBuilder:
    """The ray provider's parts for :class:`corral.provider.WorkspaceAssembly`."""

    def __init__(self, options: RayOptions, cluster: _Cluster) -> None:
        self._o = options
        self._c = cluster

    def _fail(self, message: str, *, transient: bool = False) -> WorkspaceFailedError:
        return WorkspaceFailedError(
            f"{PROVIDER_ID}: {message}", provider_id=PROVIDER_ID, transient=transient
        )

    async def create(
        self, config: ProviderConfig, session: SessionRef, capabilities: frozenset[str]
    ) -> tuple[RayRefPayload, _Opening]:
        """Place the workspace: try nodes in policy order, wait (bounded) while all are full."""
        await self._c.connect()
        deadline = time.monotonic() + self._o.open_timeout_s
        delay = 0.05
        reason = "no alive node matches the placement"
        while True:
            candidates = [
                n for n in await self._c.nodes() if n.get("Alive") and self._o.placement.admits(n)
            ]
            if candidates:
                loads = await self._loads([n["NodeID"] for n in candidates], deadline)
                reason = (
                    "every node that matches the placement is full"
                    if loads
                    else "no agent of a matching node answered in time"
                )
                # Opens this process has in flight count too (concurrent opens
                # all see the same agent counts); ties are broken at random.
                pending = self._c.pending
                random.shuffle(loads)
                order = sorted(
                    ((node, load + pending.get(node, 0)) for node, load in loads),
                    key=lambda item: item[1],
                    reverse=self._o.placement.strategy == "pack",
                )
                for node_id, load in order:
                    if load >= self._o.max_workspaces_per_node:
                        continue
                    pending[node_id] = pending.get(node_id, 0) + 1
                    try:
                        placed = await self._try_open(
                            node_id, config, session, capabilities, deadline
                        )
                    finally:
                        pending[node_id] -= 1
                        if not pending[node_id]:
                            del pending[node_id]
                    if placed is not None:
                        return placed
            if time.monotonic() + delay > deadline:
                raise self._fail(
                    f"could not place the workspace within {self._o.open_timeout_s:g} s: "
                    f"{reason}; retry later or add nodes",
                    transient=True,
                )
            await anyio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _loads(self, node_ids: list[str], deadline: float) -> list[tuple[str, int]]:
        """``(node, live workspaces)`` for every agent that answers before the deadline."""
        results: list[tuple[str, int]] = []

        async def one(node_id: str) -> None:
            try:
                handle = await self._c.agent(node_id)
                with anyio.fail_after(max(0.01, deadline - time.monotonic())):
                    # Cached with the handle (one Ray call per agent and process): the
                    # cache fills when agents are first seen, never per workspace.
                    # Before the ping, so the loads are as fresh as they were.
                    await self._c.endpoint(node_id, handle)
                    info = decode(await await_ref(handle.ping.remote()))
            except Exception as exc:
                if not unreachable(exc):
                    raise
                self._c.forget(node_id)
                return
            results.append((node_id, int(info["workspaces"])))

        async with anyio.create_task_group() as tg:
            for node_id in node_ids:
                tg.start_soon(one, node_id)
        return results

    async def _try_open(
        self,
        node_id: str,
        config: ProviderConfig,
        session: SessionRef,
        capabilities: frozenset[str],
        deadline: float,
    ) -> tuple[RayRefPayload, _Opening] | None:
        handle = await self._c.agent(node_id)
        call = handle.open.remote(dict(config.options), session, capabilities, self._o.lease_s)
        try:
            with anyio.fail_after(max(0.01, deadline - time.monotonic())):
                reply = await await_ref(call)
        except Exception as exc:
            if not unreachable(exc):
                raise
            self._c.forget(node_id)
            return None
        if reply[0] == "err" and reply[1] == "full":
            return None
        key, inner_ref, description = decode(reply)
        payload = RayRefPayload(
            workspace=key,
            cluster=self._c.gcs_address,
            node_id=node_id,
            agent=self._c.agent_name(node_id),
            inner=inner_ref,
        )
        return payload, _Opening(handle=handle, description=description)

    async def locate(self, payload: RayRefPayload) -> None:
        """Refuse another cluster's or configuration's ref, and a node that is gone."""
        from corral import ref_from_dict

        inner = ref_from_dict(payload.inner)  # the shape, strictly; a bare error otherwise
        listed = payload.inner.get("capabilities", ())
        if inner.provider_id != self._o.inner or not isinstance(listed, (list, tuple)):
            raise self._fail("workspace ref is malformed")
        await self._c.connect()
        if payload.cluster != self._c.gcs_address:
            raise self._fail("the ref names another Ray cluster than the one this process uses")
        if payload.agent != self._c.agent_name(payload.node_id):
            raise self._fail(
                "the ref was made by a ray provider configured differently "
                "(another inner provider, options or capacity)"
            )
        nodes = {n["NodeID"]: n for n in await self._c.nodes(fresh=True)}
        node = nodes.get(payload.node_id)
        if node is None or not node.get("Alive"):
            raise self._fail(
                f"node {payload.node_id} that hosted the workspace is gone; "
                "the workspace was lost with it"
            )

    async def build(self, ctx: BuildContext[RayRefPayload, _Opening]) -> Modules:
        """Proxy modules over the node agent; at resolve, attach through the agent first."""
        payload = ctx.payload
        if ctx.opening is not None:
            handle, description = ctx.opening.handle, ctx.opening.description
        else:
            handle, description = await self._attach(payload)
        direct = await self._c.endpoint(payload.node_id, handle)
        channel = Channel(handle, payload.workspace, payload.node_id, payload.agent, direct)
        keeper = lease_keeper()
        keeper.add(channel, self._o.lease_s)
        if direct is not None:
            direct_client().hold(direct)

        async def release() -> None:
            channel.closed = True
            keeper.discard(channel)
            if direct is not None:
                await direct_client().release(direct)

        ctx.releases.push_async_callback(release)

        def wrap(value: Any) -> WorkspaceRef:
            _tag, inner_ref, key = value
            return ctx.stamp(attrs.evolve(payload, workspace=key, inner=inner_ref))

        builtin = ("fs", "shell", "code", "script", "snapshot")
        modules: dict[str, object] = {}
        for name, kind in description["modules"].items():
            if name in builtin and name not in ctx.capabilities:
                continue
            if kind == "fs":
                modules[name] = FileSystemProxy(channel)
            elif kind == "shell":
                modules[name] = ShellProxy(channel)
            elif kind == "versions":
                modules[name] = VersionsProxy(channel, wrap, name)
            elif kind == "snapshot":
                modules[name] = SnapshotProxy(channel, wrap, name)
            elif kind == "code":
                modules[name] = CodeProxy(channel, name, description["languages"].get(name, ()))
            else:
                modules[name] = GenericProxy(channel, name)
        facts = {
            **description["details"],
            "ray_node_id": payload.node_id,
            "ray_agent": payload.agent,
            "inner_provider": self._o.inner,
        }
        return Modules(
            fs=modules.get("fs"),  # type: ignore[arg-type]
            shell=modules.get("shell"),  # type: ignore[arg-type]
            code=modules.get("code"),  # type: ignore[arg-type]
            script=modules.get("script"),  # type: ignore[arg-type]
            snapshot=modules.get("snapshot"),  # type: ignore[arg-type]
            extra={k: v for k, v in modules.items() if k not in builtin},
            details=lambda: facts,
        )

    async def _attach(self, payload: RayRefPayload) -> tuple[Any, Mapping[str, Any]]:
        deadline = self._o.open_timeout_s
        try:
            handle = await self._c.agent(payload.node_id)
            with anyio.fail_after(deadline):
                reply = await await_ref(
                    handle.attach.remote(payload.workspace, payload.inner, self._o.lease_s)
                )
        except Exception as exc:
            if not unreachable(exc):
                raise
            self._c.forget(payload.node_id)
            nodes = {n["NodeID"]: n for n in await self._c.nodes(fresh=True)}
            alive = bool(nodes.get(payload.node_id, {}).get("Alive"))
            raise self._fail(
                f"node {payload.node_id} that hosts the workspace "
                + (
                    "did not answer in time; retry later"
                    if alive
                    else "is gone; the workspace was lost with it"
                ),
                transient=alive,
            ) from None
        description: Mapping[str, Any] = decode(reply)
        return handle, description

    async def destroy(self, payload: RayRefPayload) -> None:
        """Ask the agent to close (and delete) the workspace; a gone node has nothing left."""
        try:
            handle = await self._c.agent(payload.node_id)
            with anyio.fail_after(self._o.open_timeout_s):
                decode(await await_ref(handle.close.remote(payload.workspace)))
        except Exception as exc:
            if not unreachable(exc):
                raise
            self._c.forget(payload.node_id)
            log.warning("corral-ray: the agent on node %s did not confirm a close", payload.node_id)
