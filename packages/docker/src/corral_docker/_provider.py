"""DockerProvider: a hardened per-session container around a persisted workspace.

Local engines: the workspace is a host directory (posix-core's layout and
TmpdirFileSystem, so file operations never enter the container) bind-mounted
at ``/workspace``. Remote engines (``ssh://``, ``tcp://``): host paths mean
nothing to the daemon, so the workspace is a named volume and file
operations go through the container (:class:`~corral_docker.ContainerFileSystem`).

The ref carries the workspace name, the options (image, limits, policy) and
the engine mode, never a container id: resolve re-probes the daemon and
replaces whatever container a crashed process left behind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final

import anyio
import anyio.to_thread
import attrs

from corral import (
    ModularWorkspace,
    OpenedWorkspace,
    ProviderConfig,
    SessionRef,
    WorkspaceFailedError,
    WorkspaceRef,
    check_ref,
    structure_payload,
    unstructure_payload,
)
from corral_posix import (
    ShellGuard,
    TmpdirFileSystem,
    TmpdirLayout,
    TmpdirRefPayload,
    sanitize_session_id,
)

from ._container import PROVIDER_ID, WorkspaceContainer, engine_failure
from ._engine import DockerEngine, EngineError, MountSpec
from ._labels import LABEL_ROOT, LABEL_SESSION, owner_labels
from ._options import WORKDIR, DockerOptions, hardening_details
from ._ownership import OwnedFileSystem, prepare_root
from ._pool import ContainerPool, PoolMember
from ._remote_fs import ContainerFileSystem, init_volume
from ._shell import DockerShell, GuardLike

__all__ = ["DockerProvider", "DockerRefPayload"]

log = logging.getLogger("corral.docker")

DEFAULT_MAX_FILE_BYTES: Final = 10 * 1024 * 1024
_SESSION_ONLY: Final = frozenset({"max_file_bytes"})


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
    max_file_bytes: int
    options: DockerOptions


def _default_guard() -> GuardLike:
    return ShellGuard(log_prefix="corral.docker.shell")


class DockerProvider:
    """Workspaces in hardened Docker containers; fails closed without an engine.

    Args:
        image, network, memory, cpus, pids_limit, user, read_only_rootfs,
            tmpfs_size, runtime, ...: Defaults of :class:`DockerOptions`
            (sessions may override them in ``ProviderConfig.options``).
        base_url: Daemon address; ``ssh://user@host`` selects remote mode.
        tmpdir_root: Parent of the host workspace directories (local mode).
        max_file_bytes: Largest file the file tools read or write.
        engine: A :class:`DockerEngine` to use instead of the SDK adapter.
        guard_factory: Builds the host-side ShellGuard of each workspace.
        pool_size: Pre-started containers kept ready for ``open`` (local
            engines; only sessions using the default options adopt them).
        **options: Further :class:`DockerOptions` fields.
    """

    provider_id: ClassVar[str] = PROVIDER_ID
    capabilities: ClassVar[frozenset[str]] = frozenset({"fs", "shell"})
    schema_version: ClassVar[int] = 2

    def __init__(
        self,
        *,
        base_url: str | None = None,
        tmpdir_root: str | None = None,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        engine: DockerEngine | None = None,
        guard_factory: Callable[[], GuardLike] | None = None,
        pool_size: int = 0,
        **options: Any,
    ) -> None:
        self._defaults = DockerOptions.from_mapping(options)
        if engine is None:
            from ._sdk import SdkEngine

            engine = SdkEngine(base_url)
        self._engine = engine
        self._base_url = base_url
        self._layout = TmpdirLayout(PROVIDER_ID, tmpdir_root)
        if isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int):
            raise WorkspaceFailedError("docker: max_file_bytes must be an integer")
        self._max_file_bytes = max_file_bytes
        self._guard_factory = guard_factory or _default_guard
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 0:
            raise WorkspaceFailedError("docker: pool_size must be a non-negative integer")
        self._pool_size = pool_size
        self._pool = (
            ContainerPool(pool_size, self._make_member, self._discard_member)
            if pool_size and not engine.remote
            else None
        )

    @property
    def engine(self) -> DockerEngine:
        """The engine this provider drives (shared infrastructure)."""
        return self._engine

    @property
    def layout(self) -> TmpdirLayout:
        """Where host workspace directories live (local mode)."""
        return self._layout

    def _fail(self, message: str, *, transient: bool = False) -> WorkspaceFailedError:
        return WorkspaceFailedError(
            f"docker: {message}", provider_id=PROVIDER_ID, transient=transient
        )

    async def _probe(self, image: str, *, pull: bool, where: str) -> None:
        try:
            await self._engine.ping()
            await self._engine.ensure_image(image, pull=pull)
        except EngineError as exc:
            raise engine_failure(exc, where=where) from None

    def _ref(self, payload: DockerRefPayload, caps: frozenset[str]) -> WorkspaceRef:
        return WorkspaceRef(
            provider_id=PROVIDER_ID,
            payload=unstructure_payload(payload),
            capabilities=caps,
            schema_version=self.schema_version,
        )

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
        if config.kind != PROVIDER_ID:
            raise self._fail("the workspace config names another provider kind")
        caps = self.capabilities if declared is None else frozenset(declared)
        if caps - self.capabilities:
            raise self._fail(
                f"cannot provide capabilities: {', '.join(sorted(caps - self.capabilities))}"
            )
        session_opts = dict(config.options)
        max_bytes = session_opts.pop("max_file_bytes", self._max_file_bytes)
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise self._fail("option max_file_bytes must be a positive integer")
        opts = DockerOptions.from_mapping(session_opts, base=self._defaults)
        await self._probe(opts.image, pull=opts.pull, where="open")
        remote = self._engine.remote
        member = None
        if self._pool is not None:
            self._pool.start()
            if opts == self._defaults and max_bytes == self._max_file_bytes:
                member = self._pool.take()
        if member is not None:
            name, base_dir = member.workspace, self._layout.base_dir
        elif remote:
            name = f"ws-{sanitize_session_id(session.session_id)}-{_token()}"
            base_dir = ""
        else:
            name = await anyio.to_thread.run_sync(self._layout.create_workspace, session.session_id)
            base_dir = self._layout.base_dir
        payload = DockerRefPayload(
            workspace=name, base_dir=base_dir, remote=remote, max_file_bytes=max_bytes, options=opts
        )
        ws = await self._assemble(
            payload,
            caps,
            session=session.session_id,
            fresh=True,
            adopt=member.container_id if member else None,
        )
        return OpenedWorkspace(workspace=ws, ref=self._ref(payload, caps))

    async def resolve(self, ref: WorkspaceRef) -> ModularWorkspace:
        """Re-probe the daemon and rebuild the container around the persisted workspace.

        Raises:
            WorkspaceFailedError: Foreign/malformed/unsupported ref, a lost
                workspace, no daemon or a missing image. Messages never repeat
                the payload.
        """
        check_ref(ref, provider_id=PROVIDER_ID, current=self.schema_version)
        payload = structure_payload(ref.payload, DockerRefPayload, provider_id=PROVIDER_ID)
        if payload.max_file_bytes <= 0 or not self._layout.is_workspace_name(payload.workspace):
            raise self._fail("workspace ref payload is malformed")
        caps = ref.capabilities or self.capabilities
        if caps - self.capabilities:
            raise self._fail("the ref lists capabilities this provider cannot provide")
        if payload.remote != self._engine.remote:
            raise self._fail("the workspace ref was made for a different kind of Docker engine")
        await self._probe(payload.options.image, pull=payload.options.pull, where="resolve")
        if payload.remote:
            try:
                exists = await self._engine.volume_exists(_volume(payload.workspace))
            except EngineError as exc:
                raise engine_failure(exc, where="resolve") from None
            if not exists:
                raise self._fail("workspace was lost: its volume no longer exists")
        else:
            await anyio.to_thread.run_sync(
                self._layout.locate,
                TmpdirRefPayload(
                    workspace=payload.workspace,
                    base_dir=payload.base_dir,
                    max_file_bytes=payload.max_file_bytes,
                ),
            )
        return await self._assemble(payload, caps, session="", fresh=False)

    async def _assemble(
        self,
        payload: DockerRefPayload,
        caps: frozenset[str],
        *,
        session: str,
        fresh: bool,
        adopt: str | None = None,
    ) -> ModularWorkspace:
        opts, name = payload.options, payload.workspace
        labels = {**owner_labels(), LABEL_SESSION: sanitize_session_id(session) if session else ""}
        root = "" if payload.remote else self._layout.workspace_path(name)
        box = self._container(payload, labels)
        state = _State()

        async def destroy() -> None:
            state.closed = True
            try:
                await box.remove()
            finally:
                if state.fs is not None:
                    state.fs.close()
                if payload.remote:
                    await self._engine.remove_volume(_volume(name))
                else:
                    await anyio.to_thread.run_sync(self._layout.remove_workspace, name)

        try:
            if adopt is not None:
                box.adopt(adopt)
            else:
                await self._prepare(payload, root, labels, fresh=fresh)
                await box.replace()
            state.fs = await self._build_fs(payload, box, root, state) if "fs" in caps else None
            shell = (
                DockerShell(
                    self._engine,
                    box.get,
                    self._guard_factory(),
                    user=opts.user,
                    closed=lambda: state.closed,
                )
                if "shell" in caps
                else None
            )
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                try:
                    await (destroy() if fresh else box.remove())
                except EngineError:
                    log.warning("docker: cleanup after a failed open/resolve also failed")
            if isinstance(exc, EngineError):
                raise engine_failure(exc, where="open" if fresh else "resolve") from None
            raise

        def details() -> Mapping[str, Any]:
            return {
                "provider": PROVIDER_ID,
                "mode": "remote" if payload.remote else "local",
                "workspace": name,
                "root": root or None,
                "volume": _volume(name) if payload.remote else None,
                "container_id": box.container_id,
                "pooled": adopt is not None,
                "capabilities": sorted(caps),
                "hardening": hardening_details(opts),
            }

        return ModularWorkspace(
            f"{PROVIDER_ID}:{name}",
            fs=state.fs,
            shell=shell,
            on_close=destroy,
            details=details,
        )

    def _container(
        self, payload: DockerRefPayload, labels: Mapping[str, str]
    ) -> WorkspaceContainer:
        name = payload.workspace
        if payload.remote:
            mount = MountSpec("volume", _volume(name), WORKDIR)
        else:
            root = self._layout.workspace_path(name)
            labels = {**labels, LABEL_ROOT: root}
            mount = MountSpec("bind", root, WORKDIR)
        return WorkspaceContainer(
            self._engine, payload.options, workspace=name, labels=labels, mount=mount
        )

    async def _make_member(self) -> PoolMember:
        name = await anyio.to_thread.run_sync(self._layout.create_workspace, "pool")
        payload = DockerRefPayload(
            workspace=name,
            base_dir=self._layout.base_dir,
            remote=False,
            max_file_bytes=self._max_file_bytes,
            options=self._defaults,
        )
        try:
            root = self._layout.workspace_path(name)
            await self._prepare(payload, root, {}, fresh=True)
            box = self._container(payload, {**owner_labels(), LABEL_SESSION: ""})
            cid = await box.replace()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._layout.remove_workspace, name)
            raise
        return PoolMember(name, cid)

    async def _discard_member(self, member: PoolMember) -> None:
        await self._engine.remove(member.container_id)
        await anyio.to_thread.run_sync(self._layout.remove_workspace, member.workspace)

    async def warm(self, *, timeout_s: float = 60.0) -> bool:
        """Start the pool and wait until it is full; False on timeout or without a pool."""
        if self._pool is None:
            return False
        self._pool.start()
        return await self._pool.wait_ready(self._pool_size, timeout_s=timeout_s)

    async def _prepare(
        self, payload: DockerRefPayload, root: str, labels: Mapping[str, str], *, fresh: bool
    ) -> None:
        if payload.remote:
            if fresh:
                volume = _volume(payload.workspace)
                await self._engine.create_volume(volume, labels)
                await init_volume(self._engine, payload.options, volume, owner_labels())
        else:
            uid, gid = payload.options.uid_gid
            await anyio.to_thread.run_sync(prepare_root, root, uid, gid)

    async def _build_fs(
        self, payload: DockerRefPayload, box: WorkspaceContainer, root: str, state: _State
    ) -> ContainerFileSystem | OwnedFileSystem:
        if payload.remote:
            return ContainerFileSystem(
                self._engine,
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

    async def aclose(self) -> None:
        """Drain the pool and release the engine client (open workspaces stay open)."""
        if self._pool is not None:
            await self._pool.aclose()
        await self._engine.aclose()


class _State:
    def __init__(self) -> None:
        self.closed = False
        self.fs: ContainerFileSystem | OwnedFileSystem | None = None


def _volume(name: str) -> str:
    return f"corral-{name}"


def _token() -> str:
    import secrets
    import string

    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))
