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

import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, ClassVar, Final

import anyio
import anyio.to_thread
import attrs

from corral.provider import (
    DEFAULT_MAX_FILE_BYTES,
    BuildContext,
    CodeInterpreter,
    FileSystem,
    ModularWorkspace,
    Modules,
    OpenedWorkspace,
    ProviderConfig,
    SessionRef,
    Shell,
    WorkspaceAssembly,
    WorkspaceRef,
    positive_size_option,
)

from ._code import PosixCodeInterpreter
from ._fs import TmpdirFileSystem
from ._layout import TmpdirLayout, TmpdirRefPayload
from ._processes import HostProcessManager, ProcessChecks
from ._resolve import Resolver
from ._shell import ProcessLimits, SubprocessShell
from ._snapshots import TmpdirSnapshotter
from ._wrapper import CommandWrapper

__all__ = ["Isolation", "TmpdirWorkspaceProvider"]

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
        terminal_wrapper: Re-shapes background processes that get a
            pseudo-terminal and gives them their controlling terminal inside
            the isolation (a sandbox that starts a session of its own would
            detach one given outside). None: ``wrapper``, with the terminal
            made controlling by the process host.
        process_checks: Guards around background processes (the checks a
            decorated shell runs around each command, for processes that
            outlive any one call).
        script: The ``script`` module this isolation provides (fresh boxes
            that see nothing of the workspace), used when ``script`` is
            declared; None: the provider has none.
        tree_writers: The pids of every process that may hold a file of the
            workspace open, or None when unknown (see
            :class:`~corral_posix.TmpdirSnapshotter`): offered only by an
            isolation under which no process can reach the tree through a
            hard link from outside it; snapshots and restores then keep a
            change journal and read only what changed.
        after_patch: Called instead of ``after_extract`` with ``(root,
            state_dir, names)`` after a restore the change journal drove
            (the names of the entries it changed; the rest of the tree is
            as it was) and after a branch (the names of all its entries).
    """

    wrapper: CommandWrapper | None = None
    cleanup: Callable[[], Awaitable[None]] | None = None
    details: Mapping[str, Any] = attrs.field(factory=dict)
    decorate_shell: Callable[[Shell], Shell] | None = None
    decorate_fs: Callable[[FileSystem], FileSystem] | None = None
    after_extract: Callable[[str, str], object] | None = None
    terminal_wrapper: CommandWrapper | None = None
    process_checks: ProcessChecks | None = None
    script: CodeInterpreter | None = None
    tree_writers: Callable[[], Iterable[int] | None] | None = None
    after_patch: Callable[[str, str, AbstractSet[str]], object] | None = None


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
        shell_limits: rlimits for every command, as :class:`~corral_posix.ProcessLimits`
            or a mapping of its fields (as plugin options arrive).
        base_env: Environment every command starts from (never stored in refs).
        snapshot_compresslevel: gzip level of snapshot tarballs (1-9).
        code_python: Interpreter of the ``code`` module's Python contexts: a
            name looked up on the box's ``PATH`` (``python3``) or an absolute
            path (local-bash only: a sandbox sees just the system directories).
    """

    provider_id: ClassVar[str] = ""
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"fs", "shell", "code", "process", "snapshot"}
    )
    schema_version: ClassVar[int] = 2

    def __init__(
        self,
        *,
        tmpdir_root: str | os.PathLike[str] | None = None,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        allow_leaf_symlinks: bool = False,
        resolver: Resolver = "auto",
        shell_limits: ProcessLimits | Mapping[str, int | None] | None = None,
        base_env: Mapping[str, str] | None = None,
        snapshot_compresslevel: int = 1,
        code_python: str = "python3",
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
                shell_limits = ProcessLimits(**shell_limits)
            except TypeError:
                raise ValueError("shell_limits has an unknown key") from None
        self._shell_limits = shell_limits
        if base_env is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in base_env.items()
        ):
            raise ValueError("base_env must map strings to strings")
        self._base_env = dict(base_env) if base_env is not None else None
        self._level = snapshot_compresslevel
        if not isinstance(code_python, str) or not code_python or "\0" in code_python:
            raise ValueError("code_python must be a program name or path")
        self._code_python = code_python
        self._assembly = WorkspaceAssembly(
            _TmpdirBuilder(self),
            provider_id=self.provider_id,
            capabilities=self.capabilities,
            schema_version=self.schema_version,
            payload_type=TmpdirRefPayload,
        )

    @property
    def layout(self) -> TmpdirLayout:
        """Where this provider keeps its workspaces."""
        return self._layout

    async def reclaim_session(self, session_id: str) -> int:
        """Remove every workspace created for ``session_id`` (``SessionReclaimer``).

        The caller holds the session exclusively (no live handle), so each
        directory named for the session is a leak of an ``open`` whose ref
        was never recorded; it goes with its state, like a closed workspace.
        """
        names = await anyio.to_thread.run_sync(self._layout.session_workspaces, session_id)
        for name in names:
            await anyio.to_thread.run_sync(self._layout.remove_workspace, name)
        return len(names)

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
            capabilities: The modules being assembled (neither ``"shell"`` nor
                ``"code"``: no command will run).

        Returns:
            The wrapper, cleanup, details and decorators for this workspace.

        Raises:
            WorkspaceFailedError: The isolation cannot be provided (fail closed).
        """
        return NO_ISOLATION

    def build_code(
        self,
        root: str,
        state_dir: str,
        wrapper: CommandWrapper | None = None,
        checks: ProcessChecks | None = None,
    ) -> PosixCodeInterpreter:
        """Build the ``code`` module of one workspace; its contexts run through ``wrapper``.

        ``checks`` are the isolation's guards (quota, protected paths), run
        around every cell.
        """
        return PosixCodeInterpreter(
            root,
            state_dir=state_dir,
            wrapper=wrapper,
            checks=checks,
            base_env=self._base_env,
            limits=self._shell_limits,
            python=self._code_python,
            provider_id=self.provider_id,
        )

    def build_shell(self, root: str, wrapper: CommandWrapper | None = None) -> Shell:
        """Build the shell of one workspace rooted at ``root``; ``wrapper`` re-shapes commands."""
        return SubprocessShell(
            root,
            wrapper=wrapper,
            base_env=self._base_env,
            limits=self._shell_limits,
            provider_id=self.provider_id,
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
        return await self._assembly.open(config, session, declared)

    async def resolve(self, ref: WorkspaceRef) -> ModularWorkspace:
        """Re-attach the workspace a ref names, after checking it is ours and intact.

        Raises:
            WorkspaceFailedError: Foreign, malformed or unsupported ref; a
                directory outside the base or not ours; or the workspace was
                lost. Messages never repeat the payload.
        """
        self._check_platform()
        return await self._assembly.resolve(ref)

    def _check_platform(self) -> None:
        if _os_name() == "nt":
            raise self._assembly.fail(
                "Windows is not supported. Use WSL and run the agent inside it."
            )


class _TmpdirBuilder:
    """The parts of a tmpdir workspace: a layout directory, its fs, shell and snapshots."""

    def __init__(self, provider: TmpdirWorkspaceProvider) -> None:
        # The provider's configuration and hooks; never per-session state.
        self._provider = provider
        self._layout = provider.layout

    async def create(
        self, config: ProviderConfig, session: SessionRef, capabilities: frozenset[str]
    ) -> tuple[TmpdirRefPayload, None]:
        """Check the session's options and make its private directory."""
        provider = self._provider
        options = dict(config.options)
        unknown = sorted(set(options) - _SESSION_OPTIONS)
        if unknown:
            raise provider._assembly.fail(f"unknown provider options: {', '.join(unknown)}")
        size = positive_size_option(options, "max_file_bytes", provider._max_file_bytes)
        if size is None:
            raise provider._assembly.fail("option max_file_bytes must be a positive integer")
        leaf = options.get("allow_leaf_symlinks", provider._allow_leaf_symlinks)
        if not isinstance(leaf, bool):
            raise provider._assembly.fail("option allow_leaf_symlinks must be a boolean")
        name = await anyio.to_thread.run_sync(self._layout.create_workspace, session.session_id)
        payload = TmpdirRefPayload(
            workspace=name,
            base_dir=self._layout.base_dir,
            max_file_bytes=size,
            allow_leaf_symlinks=leaf,
        )
        return payload, None

    async def locate(self, payload: TmpdirRefPayload) -> None:
        """Check the directory is under our base, ours, and still there."""
        await anyio.to_thread.run_sync(self._layout.locate, payload)

    async def destroy(self, payload: TmpdirRefPayload) -> None:
        """Remove the workspace directory and its state."""
        await anyio.to_thread.run_sync(self._layout.remove_workspace, payload.workspace)

    async def build(self, ctx: BuildContext[TmpdirRefPayload, None]) -> Modules:
        """Prepare the isolation, then the filesystem, shell and snapshotter declared."""
        provider, layout, payload = self._provider, self._layout, ctx.payload
        caps, name = ctx.capabilities, payload.workspace
        root = layout.workspace_path(name)
        isolation = await provider.prepare_isolation(
            root, state_dir=layout.state_path(name), capabilities=caps
        )
        if isolation.cleanup is not None:
            ctx.releases.push_async_callback(isolation.cleanup)
        fs: TmpdirFileSystem | None = None
        shell: Shell | None = None
        snap: TmpdirSnapshotter | None = None
        code: PosixCodeInterpreter | None = None
        if "fs" in caps or "snapshot" in caps:
            fs = await anyio.to_thread.run_sync(
                lambda: TmpdirFileSystem(
                    root,
                    max_file_bytes=payload.max_file_bytes,
                    allow_leaf_symlinks=payload.allow_leaf_symlinks,
                    resolver=provider._resolver,
                    provider_id=provider.provider_id,
                )
            )
            ctx.releases.callback(fs.close)
        if "shell" in caps:
            shell = provider.build_shell(root, isolation.wrapper)
            if isolation.decorate_shell is not None:
                shell = isolation.decorate_shell(shell)
            aclose = getattr(shell, "aclose", None)
            if aclose is not None:
                ctx.releases.push_async_callback(aclose)
        if "code" in caps:
            code = provider.build_code(
                root, layout.state_path(name), isolation.wrapper, isolation.process_checks
            )
            ctx.releases.push_async_callback(code.aclose)
        more: dict[str, object] = {}
        if "process" in caps:
            processes = HostProcessManager(
                root,
                layout.state_path(name),
                wrapper=isolation.wrapper,
                terminal_wrapper=isolation.terminal_wrapper,
                base_env=provider._base_env,
                limits=provider._shell_limits,
                checks=isolation.process_checks,
                provider_id=provider.provider_id,
            )
            ctx.releases.push_async_callback(processes.aclose)
            more["process"] = processes
        if "snapshot" in caps:
            snap = TmpdirSnapshotter(
                layout,
                name,
                lambda n: ctx.stamp(_with_workspace(payload, n)),
                fs=fs,
                compresslevel=provider._level,
                after_extract=isolation.after_extract,
                tree_writers=isolation.tree_writers,
                after_patch=isolation.after_patch,
            )
            ctx.releases.callback(snap.close)
            # A restore a crash interrupted is finished before anything uses the tree.
            await snap.recover()

        agent_fs: FileSystem | None = fs if "fs" in caps else None
        if agent_fs is not None and isolation.decorate_fs is not None:
            agent_fs = isolation.decorate_fs(agent_fs)
        resolver = fs.resolver if fs is not None else provider._resolver
        extra = isolation.details

        def details() -> Mapping[str, Any]:
            # Commands see the root where it lies (isolation may say otherwise);
            # a workspace without commands keeps the plain "/" view.
            where = root if shell is not None or code is not None or more else "/"
            facts = {"root": root, "resolver": resolver, "workspace_path": where}
            if code is not None:
                facts.update(code.details())
            return {**facts, **extra}

        return Modules(
            fs=agent_fs,
            shell=shell,
            code=code,
            script=isolation.script if "script" in caps else None,
            snapshot=snap,
            extra=more,
            details=details,
        )


def _os_name() -> str:
    return os.name


def _with_workspace(payload: TmpdirRefPayload, workspace: str) -> TmpdirRefPayload:
    return TmpdirRefPayload(
        workspace=workspace,
        base_dir=payload.base_dir,
        max_file_bytes=payload.max_file_bytes,
        allow_leaf_symlinks=payload.allow_leaf_symlinks,
    )
