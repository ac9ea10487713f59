"""The base of every provider whose workspace is a host directory: local-bash, local-sandbox.

A subclass sets :attr:`TmpdirWorkspaceProvider.provider_id` and, to isolate
commands, overrides :meth:`TmpdirWorkspaceProvider.prepare_isolation`; open,
resolve, snapshots and close are shared. The provider keeps only its
configuration: every per-session object (directory name, filesystem, shell,
snapshotter) lives in the workspace it returns.

``resolve`` never raises :class:`corral.WorkspaceEvictedError`: a workspace
whose directory vanished raises :class:`corral.WorkspaceFailedError` saying
it was lost (the registry cannot handle eviction from resolve, and silently
recreating an empty directory would hide the loss of the agent's files).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Final

import anyio
import anyio.to_thread
import attrs

from corral import (
    FileSystem,
    ModularWorkspace,
    OpenedWorkspace,
    ProviderConfig,
    SessionRef,
    Shell,
    WorkspaceFailedError,
    WorkspaceRef,
    check_ref,
    structure_payload,
    unstructure_payload,
)

from ._fs import TmpdirFileSystem
from ._layout import TmpdirLayout, TmpdirRefPayload
from ._resolve import Resolver
from ._shell import ResourceLimits, SubprocessShell
from ._snapshots import TmpdirSnapshotter
from ._wrapper import CommandWrapper

__all__ = ["DEFAULT_MAX_FILE_BYTES", "Isolation", "TmpdirWorkspaceProvider"]

log = logging.getLogger("corral.posix.provider")

DEFAULT_MAX_FILE_BYTES: Final = 10 * 1024 * 1024
_SESSION_OPTIONS: Final = frozenset({"max_file_bytes", "allow_leaf_symlinks"})


@attrs.frozen(kw_only=True)
class Isolation:
    """How one workspace's commands are isolated (see ``prepare_isolation``).

    Attributes:
        wrapper: Re-shapes every guarded command (None: run it as is).
        cleanup: Awaited once when the workspace closes (after its shell), or
            when assembling the workspace fails after the isolation was prepared.
        details: Extra entries merged into the workspace's ``details()``.
        decorate_shell: Wraps the built shell (e.g. to check the workspace
            after each command); must forward ``aclose``.
        decorate_fs: Wraps the file tools the agent sees (snapshots keep the
            undecorated filesystem).
        after_extract: Called (blocking, in a worker thread) with ``(root,
            state_dir)`` after a snapshot restore rewrote this workspace or a
            branch created one, before it is used (e.g. to re-verify paths
            the isolation protects: a snapshot holds whatever was there).
    """

    wrapper: CommandWrapper | None = None
    cleanup: Callable[[], Awaitable[None]] | None = None
    details: Mapping[str, Any] = attrs.field(factory=dict)
    decorate_shell: Callable[[Shell], Shell] | None = None
    decorate_fs: Callable[[FileSystem], FileSystem] | None = None
    after_extract: Callable[[str, str], object] | None = None


NO_ISOLATION: Final = Isolation()


class TmpdirWorkspaceProvider:
    """A provider whose workspaces are private directories under ``tmpdir_root``.

    Args:
        tmpdir_root: Parent of the provider's base directory; default the
            system temp dir. Must be the same at resolve time as at open.
        max_file_bytes: Largest file the filesystem reads or writes.
        allow_leaf_symlinks: Let the filesystem follow a symlink in the last
            path component when it stays inside the workspace.
        resolver: Path resolver of the filesystem (``"auto"``, ``"openat2"``, ``"walk"``).
        shell_limits: rlimits for every command, as :class:`~corral_posix.ResourceLimits`
            or a mapping of its fields (as plugin options arrive).
        base_env: Environment every command starts from (never stored in refs).
        snapshot_compresslevel: gzip level of snapshot tarballs (1-9).
    """

    provider_id: ClassVar[str] = ""
    capabilities: ClassVar[frozenset[str]] = frozenset({"fs", "shell", "snapshot"})
    schema_version: ClassVar[int] = 2

    def __init__(
        self,
        *,
        tmpdir_root: str | os.PathLike[str] | None = None,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        allow_leaf_symlinks: bool = False,
        resolver: Resolver = "auto",
        shell_limits: ResourceLimits | Mapping[str, int | None] | None = None,
        base_env: Mapping[str, str] | None = None,
        snapshot_compresslevel: int = 1,
    ) -> None:
        if not self.provider_id:
            raise TypeError("TmpdirWorkspaceProvider subclasses must set provider_id")
        if (
            isinstance(max_file_bytes, bool)
            or not isinstance(max_file_bytes, int)
            or (max_file_bytes <= 0)
        ):
            raise ValueError("max_file_bytes must be a positive integer")
        if not 1 <= snapshot_compresslevel <= 9:
            raise ValueError("snapshot_compresslevel must be between 1 and 9")
        self._layout = TmpdirLayout(self.provider_id, tmpdir_root)
        self._max_file_bytes = max_file_bytes
        self._allow_leaf_symlinks = bool(allow_leaf_symlinks)
        self._resolver = resolver
        if isinstance(shell_limits, Mapping):
            try:
                shell_limits = ResourceLimits(**shell_limits)
            except TypeError:
                raise ValueError("shell_limits has an unknown key") from None
        self._shell_limits = shell_limits
        if base_env is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in base_env.items()
        ):
            raise ValueError("base_env must map strings to strings")
        self._base_env = dict(base_env) if base_env is not None else None
        self._level = snapshot_compresslevel

    @property
    def layout(self) -> TmpdirLayout:
        """Where this provider keeps its workspaces."""
        return self._layout

    # -- hooks for subclasses --------------------------------------------------

    async def prepare_isolation(
        self, root: str, *, state_dir: str, capabilities: frozenset[str]
    ) -> Isolation:
        """Prepare the isolation of one workspace; the default isolates nothing.

        Called at every ``open`` and ``resolve``, after the workspace directory
        exists and before its shell is built. local-sandbox overrides it to
        detect bubblewrap and build the per-workspace sandbox resources.

        Args:
            root: Host path of the workspace root.
            state_dir: The workspace's private state directory, outside the
                workspace (same filesystem), removed with the workspace.
            capabilities: The modules being assembled (``"shell"`` absent: no
                command will run).

        Returns:
            The wrapper, cleanup, details and decorators for this workspace.

        Raises:
            WorkspaceFailedError: The isolation cannot be provided (fail closed).
        """
        return NO_ISOLATION

    def build_shell(self, root: str, wrapper: CommandWrapper | None = None) -> Shell:
        """Build the shell of one workspace rooted at ``root``; ``wrapper`` re-shapes commands."""
        return SubprocessShell(
            root,
            wrapper=wrapper,
            base_env=self._base_env,
            limits=self._shell_limits,
            provider_id=self.provider_id,
        )

    # -- helpers ---------------------------------------------------------------

    def _fail(self, message: str) -> WorkspaceFailedError:
        return WorkspaceFailedError(f"{self.provider_id}: {message}", provider_id=self.provider_id)

    def _check_platform(self) -> None:
        if _os_name() == "nt":
            raise self._fail("Windows is not supported. Use WSL and run the agent inside it.")

    def _wanted(self, declared: frozenset[str] | None) -> frozenset[str]:
        if declared is None:
            return self.capabilities
        missing = sorted(set(declared) - self.capabilities)
        if missing:
            raise self._fail(f"cannot provide capabilities: {', '.join(missing)}")
        return frozenset(declared)

    def _payload(self, config: ProviderConfig) -> TmpdirRefPayload:
        options = dict(config.options)
        unknown = sorted(set(options) - _SESSION_OPTIONS)
        if unknown:
            raise self._fail(f"unknown provider options: {', '.join(unknown)}")
        size = options.get("max_file_bytes", self._max_file_bytes)
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise self._fail("option max_file_bytes must be a positive integer")
        leaf = options.get("allow_leaf_symlinks", self._allow_leaf_symlinks)
        if not isinstance(leaf, bool):
            raise self._fail("option allow_leaf_symlinks must be a boolean")
        return TmpdirRefPayload(
            workspace="",
            base_dir=self._layout.base_dir,
            max_file_bytes=size,
            allow_leaf_symlinks=leaf,
        )

    def _ref(self, payload: TmpdirRefPayload, caps: frozenset[str]) -> WorkspaceRef:
        return WorkspaceRef(
            provider_id=self.provider_id,
            payload=unstructure_payload(payload),
            capabilities=caps,
            schema_version=self.schema_version,
        )

    async def _assemble(
        self, payload: TmpdirRefPayload, caps: frozenset[str], *, owned: bool
    ) -> ModularWorkspace:
        layout, name = self._layout, payload.workspace
        root = layout.workspace_path(name)
        fs: TmpdirFileSystem | None = None
        shell: Shell | None = None
        snap: TmpdirSnapshotter | None = None
        isolation: Isolation | None = None

        async def release() -> None:
            if snap is not None:
                snap.close()
            try:
                aclose = getattr(shell, "aclose", None)
                if aclose is not None:
                    await aclose()
            finally:
                try:
                    if isolation is not None and isolation.cleanup is not None:
                        await isolation.cleanup()
                finally:
                    if fs is not None:
                        fs.close()

        async def cleanup() -> None:
            try:
                await release()
            finally:
                await anyio.to_thread.run_sync(layout.remove_workspace, name)

        try:
            isolation = await self.prepare_isolation(
                root, state_dir=layout.state_path(name), capabilities=caps
            )
            if "fs" in caps or "snapshot" in caps:
                fs = await anyio.to_thread.run_sync(
                    lambda: TmpdirFileSystem(
                        root,
                        max_file_bytes=payload.max_file_bytes,
                        allow_leaf_symlinks=payload.allow_leaf_symlinks,
                        resolver=self._resolver,
                        provider_id=self.provider_id,
                    )
                )
            if "shell" in caps:
                shell = self.build_shell(root, isolation.wrapper)
                if isolation.decorate_shell is not None:
                    shell = isolation.decorate_shell(shell)
            if "snapshot" in caps:
                snap = TmpdirSnapshotter(
                    layout,
                    name,
                    lambda n: self._ref(_with_workspace(payload, n), caps),
                    fs=fs,
                    compresslevel=self._level,
                    after_extract=isolation.after_extract,
                )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await (cleanup() if owned else release())
            raise

        extra = isolation.details

        def details() -> Mapping[str, Any]:
            return {
                "provider": self.provider_id,
                "root": root,
                "resolver": getattr(fs, "resolver", self._resolver),
                "capabilities": sorted(caps),
                **extra,
            }

        agent_fs: FileSystem | None = fs if "fs" in caps else None
        if agent_fs is not None and isolation.decorate_fs is not None:
            agent_fs = isolation.decorate_fs(agent_fs)
        return ModularWorkspace(
            f"{self.provider_id}:{name}",
            fs=agent_fs,
            shell=shell,
            snapshot=snap,
            on_close=cleanup,
            details=details,
        )

    # -- the provider contract -------------------------------------------------

    async def open(
        self,
        config: ProviderConfig,
        session: SessionRef,
        declared: frozenset[str] | None = None,
    ) -> OpenedWorkspace:
        """Create a private directory for the session and the modules declared.

        Raises:
            WorkspaceFailedError: Windows, a foreign config kind, bad options, a
                declared capability this provider lacks, or an unusable base dir.
        """
        self._check_platform()
        if config.kind != self.provider_id:
            raise self._fail("the workspace config names another provider kind")
        caps = self._wanted(declared)
        template = self._payload(config)
        name = await anyio.to_thread.run_sync(self._layout.create_workspace, session.session_id)
        payload = _with_workspace(template, name)
        workspace = await self._assemble(payload, caps, owned=True)
        return OpenedWorkspace(workspace=workspace, ref=self._ref(payload, caps))

    async def resolve(self, ref: WorkspaceRef) -> ModularWorkspace:
        """Re-attach the workspace a ref names, after checking it is ours and intact.

        Raises:
            WorkspaceFailedError: Foreign, malformed or unsupported ref; a
                directory outside the base or not ours; or the workspace was
                lost. Messages never repeat the payload.
        """
        self._check_platform()
        check_ref(ref, provider_id=self.provider_id, current=self.schema_version)
        payload = structure_payload(ref.payload, TmpdirRefPayload, provider_id=self.provider_id)
        if payload.max_file_bytes <= 0:
            raise self._fail("workspace ref payload is malformed")
        caps = ref.capabilities or self.capabilities
        if caps - self.capabilities:
            raise self._fail("the ref lists capabilities this provider cannot provide")
        await anyio.to_thread.run_sync(self._layout.locate, payload)
        return await self._assemble(payload, caps, owned=False)


def _os_name() -> str:
    return os.name


def _with_workspace(payload: TmpdirRefPayload, workspace: str) -> TmpdirRefPayload:
    return TmpdirRefPayload(
        workspace=workspace,
        base_dir=payload.base_dir,
        max_file_bytes=payload.max_file_bytes,
        allow_leaf_symlinks=payload.allow_leaf_symlinks,
    )
