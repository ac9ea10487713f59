"""DockerProvider: a hardened per-session container around a persisted workspace.

Local engines: the workspace is a host directory (posix-core's layout and
TmpdirFileSystem, so file operations never enter the container) bind-mounted
at ``/workspace``. Remote engines (``ssh://``, ``tcp://``): host paths mean
nothing to the daemon, so the workspace is a named volume and file
operations go through the container (:class:`~corral_docker.ContainerFileSystem`).

The ref carries the workspace name, the options (image, limits, policy) and
the engine mode, never a container id: resolve re-probes the daemon, joins
the container another open handle of the workspace uses, and replaces
whatever container a crashed process left behind (see ``_container``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Final

import anyio
import anyio.to_thread
import attrs

from corral.provider import (
    DEFAULT_MAX_FILE_BYTES,
    BuildContext,
    FileSystem,
    ModularWorkspace,
    Modules,
    OpenedWorkspace,
    ProviderConfig,
    SessionRef,
    WorkspaceAssembly,
    WorkspaceFailedError,
    WorkspaceRef,
    positive_size_option,
)
from corral_posix import (
    CommandChecker,
    TmpdirFileSystem,
    TmpdirLayout,
    TmpdirRefPayload,
    remove_tree,
    sanitize_session_id,
)

from ._archive_versions import ArchiveSnapshotter
from ._attach import AttachingEngine
from ._code import build_docker_code
from ._container import PROVIDER_ID, WorkspaceContainer, engine_failure
from ._engine import DockerEngine, EngineError, MountSpec
from ._labels import LABEL_ROOT, LABEL_SESSION, LABEL_WORKSPACE, owner_labels
from ._options import WORKDIR, DockerOptions, hardening_details
from ._ownership import OwnedFileSystem, prepare_root
from ._pool import ContainerPool, PoolMember
from ._processes import DockerProcessManager
from ._remote_fs import ContainerFileSystem, init_volume
from ._script import DockerScriptRunner, build_docker_script
from ._shell import DockerShell
from ._versions import CommandGate, DockerSnapshotter

__all__ = ["DockerProvider", "DockerRefPayload"]

log = logging.getLogger("corral.docker")

_SCHEMA_VERSION: Final = 2


@attrs.frozen(kw_only=True)
class DockerRefPayload:
    """What resolve needs to rebuild a docker workspace; no container id, no secrets.

    Attributes:
        workspace: Workspace name (host directory name, or volume suffix).
        base_dir: The tmpdir layout base (local mode), else ``""``.
        remote: Whether the workspace is a volume on a remote engine.
        max_file_bytes: File size cap of the file tools.
        options: Image, limits and hardening of the container.
    """

    workspace: str
    base_dir: str
    remote: bool
    max_file_bytes: int = attrs.field(validator=attrs.validators.gt(0))
    options: DockerOptions


def _default_checker() -> CommandChecker:
    return CommandChecker(log_prefix="corral.docker.shell")


class DockerProvider:
    """Workspaces in hardened Docker containers; fails closed without an engine.

    Open and resolve go through core's :class:`~corral.provider.WorkspaceAssembly`
    like every provider here; the container lifecycle, the host directory or
    remote volume, and the pool are this provider's parts.

    Args:
        image, network, memory, cpus, pids_limit, user, read_only_rootfs,
            tmpfs_size, runtime, ...: Defaults of :class:`DockerOptions`
            (sessions may override them in ``ProviderConfig.options``).
        base_url: Daemon address; ``ssh://user@host`` selects remote mode.
        tmpdir_root: Parent of the host workspace directories (local mode).
        max_file_bytes: Largest file the file tools read or write (default
            :data:`corral.provider.DEFAULT_MAX_FILE_BYTES`).
        engine: A :class:`DockerEngine` to use instead of the SDK adapter.
        checker_factory: Builds the host-side :class:`~corral_posix.CommandChecker`
            each workspace's commands are checked against.
        pool_size: Pre-started containers kept ready for ``open`` (local
            engines; only sessions using the default options adopt them).
        **options: Further :class:`DockerOptions` fields.
    """

    provider_id: ClassVar[str] = PROVIDER_ID
    capabilities: frozenset[str] = frozenset({"fs", "shell", "snapshot"})
    """What this provider can populate: ``snapshot`` on every engine (a remote
    engine's volume is versioned through the archive endpoints, see
    :mod:`._archive_versions`); ``process`` and ``code`` when the engine attaches
    exec streams (the SDK engine does), so such an instance widens it."""
    schema_version: ClassVar[int] = _SCHEMA_VERSION

    def __init__(
        self,
        *,
        base_url: str | None = None,
        tmpdir_root: str | None = None,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        engine: DockerEngine | None = None,
        checker_factory: Callable[[], CommandChecker] | None = None,
        pool_size: int = 0,
        **options: Any,
    ) -> None:
        defaults = DockerOptions.from_mapping(options)
        if engine is None:
            from ._sdk import SdkEngine

            engine = SdkEngine(base_url)
        if isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int):
            raise WorkspaceFailedError("docker: max_file_bytes must be an integer")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 0:
            raise WorkspaceFailedError("docker: pool_size must be a non-negative integer")
        self._base_url = base_url
        self._pool_size = pool_size
        if isinstance(engine, AttachingEngine):
            # Background processes and code contexts need attached exec streams
            # (the SDK engine has them).
            self.capabilities = self.capabilities | {"process", "code", "script"}
        self._parts = _DockerBuilder(
            engine,
            TmpdirLayout(PROVIDER_ID, tmpdir_root),
            defaults=defaults,
            max_file_bytes=max_file_bytes,
            checker_factory=checker_factory or _default_checker,
            pool_size=pool_size,
        )
        self._assembly = WorkspaceAssembly(
            self._parts,
            provider_id=PROVIDER_ID,
            capabilities=self.capabilities,
            schema_version=self.schema_version,
            payload_type=DockerRefPayload,
        )

    @property
    def engine(self) -> DockerEngine:
        """The engine this provider drives (shared infrastructure)."""
        return self._parts.engine

    @property
    def layout(self) -> TmpdirLayout:
        """Where host workspace directories live (local mode)."""
        return self._parts.layout

    async def reclaim_session(self, session_id: str) -> int:
        """Remove every workspace created for ``session_id`` (``SessionReclaimer``).

        Found two ways, since a crash can come before or after the container
        exists: containers labelled with the session (a pooled box, labelled
        before it had a session, is not found: `corral docker gc` removes it),
        and, in local mode, host directories named for it. Each goes the way
        a closed workspace goes (containers, then the volume or directory).
        """
        names = {
            box.labels.get(LABEL_WORKSPACE, "")
            for box in await self.engine.list_containers(
                {LABEL_SESSION: sanitize_session_id(session_id)}
            )
        }
        remote = self.engine.remote
        if not remote:
            names |= set(await anyio.to_thread.run_sync(self.layout.session_workspaces, session_id))
        found = sorted(n for n in names if self.layout.is_workspace_name(n))
        for name in found:
            await self._parts.remove_named(name, remote=remote)
        return len(found)

    async def open(
        self,
        config: ProviderConfig,
        session: SessionRef,
        declared: frozenset[str] | None = None,
    ) -> OpenedWorkspace:
        """Create the workspace and start its container.

        Raises:
            WorkspaceFailedError: Bad options, no daemon, image missing and not
                pullable (transient only for daemon hiccups).
        """
        return await self._assembly.open(config, session, declared)

    async def resolve(self, ref: WorkspaceRef) -> ModularWorkspace:
        """Re-probe the daemon and rebuild the container around the persisted workspace.

        Raises:
            WorkspaceFailedError: Foreign/malformed/unsupported ref, a lost
                workspace, no daemon or a missing image. Messages never repeat
                the payload.
        """
        return await self._assembly.resolve(ref)

    async def warm(self, *, timeout_s: float = 60.0) -> bool:
        """Start the pool and wait until it is full; False on timeout or without a pool."""
        pool = self._parts.pool
        if pool is None:
            return False
        pool.start()
        return await pool.wait_ready(self._pool_size, timeout_s=timeout_s)

    async def aclose(self) -> None:
        """Drain the pool and release the engine client (open workspaces stay open)."""
        if self._parts.pool is not None:
            await self._parts.pool.aclose()
        await self._parts.engine.aclose()


@attrs.frozen
class _Opening:
    """What ``create`` hands to ``build`` at open: the session label and a pooled container."""

    session: str
    adopt: str | None


class _State:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class _DockerBuilder:
    """Docker's parts: a host directory or remote volume, a container, its fs and shell.

    Holds the provider's shared infrastructure (engine, layout, pool) and
    defaults; every per-session object lives in the workspace it builds.
    """

    def __init__(
        self,
        engine: DockerEngine,
        layout: TmpdirLayout,
        *,
        defaults: DockerOptions,
        max_file_bytes: int,
        checker_factory: Callable[[], CommandChecker],
        pool_size: int,
    ) -> None:
        self.engine = engine
        self.layout = layout
        self._defaults = defaults
        self._max_file_bytes = max_file_bytes
        self._checker_factory = checker_factory
        # The interpreters of each image, probed once for code and script alike
        # (see _interpreters.image_interpreters).
        self._interpreters: dict[str, frozenset[str]] = {}
        self.pool = (
            ContainerPool(pool_size, self._make_member, self._discard_member)
            if pool_size and not engine.remote
            else None
        )

    def _fail(self, message: str) -> WorkspaceFailedError:
        return WorkspaceFailedError(f"docker: {message}", provider_id=PROVIDER_ID)

    async def _probe(self, image: str, *, pull: bool, where: str) -> None:
        try:
            await self.engine.ping()
            await self.engine.ensure_image(image, pull=pull)
        except EngineError as exc:
            raise engine_failure(exc, where=where) from None

    async def create(
        self, config: ProviderConfig, session: SessionRef, capabilities: frozenset[str]
    ) -> tuple[DockerRefPayload, _Opening]:
        """Check the session's options, probe the daemon, and make (or adopt) the storage."""
        session_opts = dict(config.options)
        max_bytes = positive_size_option(session_opts, "max_file_bytes", self._max_file_bytes)
        if max_bytes is None:
            raise self._fail("option max_file_bytes must be a positive integer")
        session_opts.pop("max_file_bytes", None)
        opts = DockerOptions.from_mapping(session_opts, base=self._defaults)
        await self._probe(opts.image, pull=opts.pull, where="open")
        remote = self.engine.remote
        member = None
        if self.pool is not None:
            self.pool.start()
            if opts == self._defaults and max_bytes == self._max_file_bytes:
                member = self.pool.take()
        if member is not None:
            name, base_dir = member.workspace, self.layout.base_dir
        elif remote:
            name = f"ws-{sanitize_session_id(session.session_id)}-{_token()}"
            base_dir = ""
        else:
            name = await anyio.to_thread.run_sync(self.layout.create_workspace, session.session_id)
            base_dir = self.layout.base_dir
        payload = DockerRefPayload(
            workspace=name, base_dir=base_dir, remote=remote, max_file_bytes=max_bytes, options=opts
        )
        opening = _Opening(session.session_id, member.container_id if member else None)
        return payload, opening

    async def locate(self, payload: DockerRefPayload) -> None:
        """Check the ref suits this engine, probe the daemon, and find the storage."""
        if not self.layout.is_workspace_name(payload.workspace):
            raise self._fail("workspace ref payload is malformed")
        if payload.remote != self.engine.remote:
            raise self._fail("the workspace ref was made for a different kind of Docker engine")
        await self._probe(payload.options.image, pull=payload.options.pull, where="resolve")
        if payload.remote:
            try:
                exists = await self.engine.volume_exists(_volume(payload.workspace))
            except EngineError as exc:
                raise engine_failure(exc, where="resolve") from None
            if not exists:
                raise self._fail("workspace was lost: its volume no longer exists")
        else:
            await anyio.to_thread.run_sync(
                self.layout.locate,
                TmpdirRefPayload(
                    workspace=payload.workspace,
                    base_dir=payload.base_dir,
                    max_file_bytes=payload.max_file_bytes,
                ),
            )

    async def destroy(self, payload: DockerRefPayload) -> None:
        """Remove the workspace's volume or host directory."""
        await self.remove_named(payload.workspace, remote=payload.remote)

    async def remove_named(self, name: str, *, remote: bool) -> None:
        """Remove workspace ``name``: its containers, then its volume or host directory."""
        # Handles of other processes may still hold a container of the workspace:
        # it goes with the workspace (a remote volume would stay busy otherwise).
        try:
            for box in await self.engine.list_containers({LABEL_WORKSPACE: name}):
                await self.engine.remove(box.id)
        except EngineError:
            if remote:
                raise
            # The host directory still goes; a container left behind is gc's.
        if remote:
            await self.engine.remove_volume(_volume(name))
            # Process records of a remote workspace live on this host.
            await anyio.to_thread.run_sync(remove_tree, self.layout.state_path(name))
        else:
            await anyio.to_thread.run_sync(self.layout.remove_workspace, name)

    async def build(self, ctx: BuildContext[DockerRefPayload, _Opening]) -> Modules:
        """Start (or adopt, or replace) the container, then its filesystem and shell."""
        payload, caps, opening = ctx.payload, ctx.capabilities, ctx.opening
        opts, name = payload.options, payload.workspace
        session = opening.session if opening is not None else ""
        adopt = opening.adopt if opening is not None else None
        labels = {**owner_labels(), LABEL_SESSION: sanitize_session_id(session) if session else ""}
        root = "" if payload.remote else self.layout.workspace_path(name)
        box = self._container(payload, labels)
        state = _State()
        gate = CommandGate()
        ctx.releases.push_async_callback(box.remove)
        fs: FileSystem | None = None
        snap: DockerSnapshotter | None = None
        extra: dict[str, object] = {}
        try:
            if adopt is not None:
                box.adopt(adopt)
            else:
                await self._prepare(payload, root, labels, fresh=ctx.fresh)
                # Resolve joins the container another open handle uses, never replaces it.
                await (box.replace() if ctx.fresh else box.join_or_start())
            if "fs" in caps:
                built = await self._build_fs(payload, box, root, state)
                ctx.releases.callback(built.close)
                fs = built
            shell = (
                DockerShell(
                    self.engine,
                    box.get,
                    self._checker_factory(),
                    user=opts.user,
                    closed=lambda: state.closed,
                    gate=gate.wait,
                )
                if "shell" in caps
                else None
            )
            if "process" in caps:
                processes = DockerProcessManager(
                    self.engine,
                    box.get,
                    self._checker_factory(),
                    user=opts.user,
                    state_dir=self.layout.state_path(name),
                    root=root or None,
                    gate=gate.wait,
                )
                # Before the container goes: its processes end recorded as killed.
                ctx.releases.push_async_callback(processes.aclose)
                extra["process"] = processes
            code = (
                await build_docker_code(
                    self.engine,
                    box.get,
                    user=opts.user,
                    root=root or None,
                    gate=gate.wait,
                    state_dir=self.layout.state_path(name),
                    image=opts.image,
                    probed=self._interpreters,
                )
                if "code" in caps
                else None
            )
            if code is not None:
                # Before the container goes: its contexts end recorded as lost.
                ctx.releases.push_async_callback(code.aclose)
            script: DockerScriptRunner | None = None
            if "script" in caps:
                script = await build_docker_script(
                    self.engine,
                    box.get,
                    opts,
                    labels=labels,
                    workspace=name,
                    root=root or None,
                    probed=self._interpreters,
                )
                ctx.releases.callback(script.close)
            if "snapshot" in caps:
                snap = self._snapshotter(ctx, box, gate)
                ctx.releases.callback(snap.close)
                # A restore a crash interrupted is finished before anything uses the tree.
                await snap.recover()
        except EngineError as exc:
            raise engine_failure(exc, where="open" if ctx.fresh else "resolve") from None
        # Pushed last, so it runs first at close: nothing starts while the box goes away.
        ctx.releases.callback(state.close)

        def details() -> Mapping[str, Any]:
            return {
                "mode": "remote" if payload.remote else "local",
                "workspace": name,
                "root": root or None,
                # Where commands see the workspace (corral's one path namespace).
                "workspace_path": WORKDIR if shell is not None else "/",
                "volume": _volume(name) if payload.remote else None,
                "container_id": box.container_id,
                "pooled": adopt is not None,
                "hardening": hardening_details(opts),
                **(code.details() if code is not None else {}),
                **(script.details() if script is not None else {}),
            }

        return Modules(
            fs=fs,
            shell=shell,
            code=code,
            script=script,
            snapshot=snap,
            extra=extra,
            details=details,
        )

    def _snapshotter(
        self,
        ctx: BuildContext[DockerRefPayload, _Opening],
        box: WorkspaceContainer,
        gate: CommandGate,
    ) -> DockerSnapshotter:
        payload = ctx.payload
        if payload.remote:
            return ArchiveSnapshotter(
                self.layout,
                payload.workspace,
                lambda name: ctx.stamp(attrs.evolve(payload, workspace=name)),
                engine=self.engine,
                container=box.get,
                gate=gate,
                user=payload.options.user,
                uid_gid=payload.options.uid_gid,
                new_workspace=lambda fill: self._remote_branch(payload, fill),
            )
        return DockerSnapshotter(
            self.layout,
            payload.workspace,
            lambda name: ctx.stamp(attrs.evolve(payload, workspace=name)),
            engine=self.engine,
            container=box.get,
            gate=gate,
            user=payload.options.user,
            uid_gid=payload.options.uid_gid,
        )

    async def _remote_branch(
        self, payload: DockerRefPayload, fill: Callable[[str], Awaitable[None]]
    ) -> str:
        """A new remote workspace volume, filled by ``fill`` through a container on it.

        The container is removed afterwards; resolving the branch's ref
        starts the workspace's own. On failure the volume goes too.
        """
        session_part = payload.workspace[len("ws-") : -len("-xxxxxxxx")]
        name = f"ws-{session_part}-{_token()}"
        branch = attrs.evolve(payload, workspace=name)
        labels = {**owner_labels(), LABEL_SESSION: ""}
        await self._prepare(branch, "", labels, fresh=True)
        box = self._container(branch, labels)
        try:
            await fill(await box.replace())
        except BaseException:
            with anyio.CancelScope(shield=True):
                await box.remove()
                await self.engine.remove_volume(_volume(name))
            raise
        await box.remove()
        return name

    def _container(
        self, payload: DockerRefPayload, labels: Mapping[str, str]
    ) -> WorkspaceContainer:
        name = payload.workspace
        if payload.remote:
            mount = MountSpec("volume", _volume(name), WORKDIR)
        else:
            root = self.layout.workspace_path(name)
            labels = {**labels, LABEL_ROOT: root}
            mount = MountSpec("bind", root, WORKDIR)
        return WorkspaceContainer(
            self.engine, payload.options, workspace=name, labels=labels, mount=mount
        )

    async def _make_member(self) -> PoolMember:
        name = await anyio.to_thread.run_sync(self.layout.create_workspace, "pool")
        payload = DockerRefPayload(
            workspace=name,
            base_dir=self.layout.base_dir,
            remote=False,
            max_file_bytes=self._max_file_bytes,
            options=self._defaults,
        )
        try:
            root = self.layout.workspace_path(name)
            await self._prepare(payload, root, {}, fresh=True)
            box = self._container(payload, {**owner_labels(), LABEL_SESSION: ""})
            cid = await box.replace()
            box.detach()  # the pool holds it until a session adopts it
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.layout.remove_workspace, name)
            raise
        return PoolMember(name, cid)

    async def _discard_member(self, member: PoolMember) -> None:
        await self.engine.remove(member.container_id)
        await anyio.to_thread.run_sync(self.layout.remove_workspace, member.workspace)

    async def _prepare(
        self, payload: DockerRefPayload, root: str, labels: Mapping[str, str], *, fresh: bool
    ) -> None:
        if payload.remote:
            if fresh:
                volume = _volume(payload.workspace)
                await self.engine.create_volume(volume, labels)
                await init_volume(self.engine, payload.options, volume, owner_labels())
        else:
            uid, gid = payload.options.uid_gid
            await anyio.to_thread.run_sync(prepare_root, root, uid, gid)

    async def _build_fs(
        self, payload: DockerRefPayload, box: WorkspaceContainer, root: str, state: _State
    ) -> ContainerFileSystem | OwnedFileSystem:
        if payload.remote:
            return ContainerFileSystem(
                self.engine,
                box.get,
                user=payload.options.user,
                max_file_bytes=payload.max_file_bytes,
                closed=lambda: state.closed,
            )
        inner = await anyio.to_thread.run_sync(
            lambda: TmpdirFileSystem(
                root, max_file_bytes=payload.max_file_bytes, provider_id=PROVIDER_ID
            )
        )
        uid, gid = payload.options.uid_gid
        return OwnedFileSystem(inner, root, uid, gid)


def _volume(name: str) -> str:
    return f"corral-{name}"


def _token() -> str:
    import secrets
    import string

    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))
