"""The ``in-memory`` provider: open, resolve and close workspaces held in this process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import anyio.lowlevel
import attrs

from corral.provider import (
    BuildContext,
    ConfigError,
    Modules,
    OpenedWorkspace,
    ProviderConfig,
    SessionRef,
    Workspace,
    WorkspaceAssembly,
    WorkspaceFailedError,
    WorkspaceRef,
)

from ._fs import InMemoryFileSystem
from ._snapshot import InMemorySnapshotter
from ._store import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_GREP_FILE_BYTES,
    DEFAULT_MAX_SNAPSHOTS,
    DEFAULT_MAX_WORKSPACE_BYTES,
    Limits,
    WorkspaceState,
    discard,
    find,
    new_workspace,
    process_token,
)

__all__ = ["PROVIDER_ID", "SCHEMA_VERSION", "SUPPORTED_CAPABILITIES", "InMemoryProvider"]

PROVIDER_ID: Final = "in-memory"
SCHEMA_VERSION: Final = 2
SUPPORTED_CAPABILITIES: Final = frozenset({"fs", "snapshot"})

_LOST: Final = (
    "the in-memory workspace was lost: the process that held it has exited "
    "(in-memory workspaces do not survive a restart)"
)
_GONE: Final = "the in-memory workspace is gone: it was closed (or never existed in this process)"


@attrs.frozen
class RefPayload:
    """The ref payload: which workspace, and which process holds it."""

    workspace_id: str = attrs.field(validator=attrs.validators.matches_re(r"mem-[0-9a-f]{32}"))
    process_token: str = attrs.field(validator=attrs.validators.matches_re(r"[0-9a-f]{32}"))

    @property
    def workspace(self) -> str:
        """The workspace's name in the store; its id is ``in-memory:<name>``."""
        return self.workspace_id


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"in-memory provider option {name}: expected a positive integer")
    return value


class InMemoryProvider:
    """Workspaces held in this process's memory: for tests, demos and ephemeral agents.

    Nothing survives the process: resolving a ref after a restart raises
    :class:`corral.WorkspaceFailedError` saying the workspace was lost. The
    provider holds no per-session state; workspaces live in a process-wide
    store keyed by random ids, so any instance can resolve any ref of this
    process and sessions never share files.

    Args:
        max_workspace_bytes: Budget per workspace for file contents plus a
            fixed overhead per file or directory; writes beyond it fail with
            ``OperationError(code="too_large")``.
        max_file_bytes: Largest single file (``too_large`` beyond it).
        max_grep_file_bytes: grep lists larger files in ``skipped_paths``.
        max_snapshots: Snapshots one workspace may hold at once.

    Raises:
        ConfigError: An option is not a positive integer.
    """

    def __init__(
        self,
        *,
        max_workspace_bytes: int = DEFAULT_MAX_WORKSPACE_BYTES,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_grep_file_bytes: int = DEFAULT_MAX_GREP_FILE_BYTES,
        max_snapshots: int = DEFAULT_MAX_SNAPSHOTS,
    ) -> None:
        self._limits = Limits(
            max_workspace_bytes=_positive("max_workspace_bytes", max_workspace_bytes),
            max_file_bytes=_positive("max_file_bytes", max_file_bytes),
            max_grep_file_bytes=_positive("max_grep_file_bytes", max_grep_file_bytes),
            max_snapshots=_positive("max_snapshots", max_snapshots),
        )
        # fs is built whatever is declared: an in-memory workspace is its files.
        self._assembly = WorkspaceAssembly(
            _MemoryBuilder(self._limits),
            provider_id=PROVIDER_ID,
            capabilities=SUPPORTED_CAPABILITIES,
            schema_version=SCHEMA_VERSION,
            payload_type=RefPayload,
            always=frozenset({"fs"}),
        )

    @property
    def provider_id(self) -> str:
        """Always ``in-memory``."""
        return PROVIDER_ID

    @property
    def capabilities(self) -> frozenset[str]:
        """``fs`` and ``snapshot``."""
        return SUPPORTED_CAPABILITIES

    @property
    def schema_version(self) -> int:
        """The current ref payload version (refs of ``None``, 1 and 2 resolve)."""
        return SCHEMA_VERSION

    @property
    def limits(self) -> Limits:
        """The bounds given to workspaces this provider opens."""
        return self._limits

    async def open(
        self,
        config: ProviderConfig,
        session: SessionRef,
        declared: frozenset[str] | None = None,
    ) -> OpenedWorkspace:
        """Create an empty workspace for a session.

        ``fs`` is always built; ``snapshot`` only when ``declared`` is None or
        names it. The ref's capabilities say exactly what was built.

        Raises:
            WorkspaceFailedError: ``declared`` names a capability this provider
                cannot populate, or the config carries options.
        """
        return await self._assembly.open(config, session, declared)

    async def resolve(self, ref: WorkspaceRef) -> Workspace:
        """Re-attach a workspace of this process from its ref.

        Raises:
            WorkspaceFailedError: The ref is foreign, malformed or of an
                unsupported version; it was made by another (exited) process;
                or its workspace has been closed.
        """
        if not isinstance(ref, WorkspaceRef):
            raise WorkspaceFailedError("workspace ref is malformed", provider_id=PROVIDER_ID)
        return await self._assembly.resolve(ref)

    def __repr__(self) -> str:
        return f"InMemoryProvider({self._limits})"


class _MemoryBuilder:
    """The parts of an in-memory workspace: an entry in the process-wide store."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits

    async def create(
        self, config: ProviderConfig, session: SessionRef, capabilities: frozenset[str]
    ) -> tuple[RefPayload, None]:
        """Refuse per-session options and register a fresh workspace."""
        await anyio.lowlevel.checkpoint()
        if config.options:
            raise WorkspaceFailedError(
                "the in-memory provider takes no per-session options; "
                "pass limits as provider options instead",
                provider_id=PROVIDER_ID,
            )
        state = new_workspace(self._limits)
        return RefPayload(workspace_id=state.workspace_id, process_token=process_token()), None

    async def locate(self, payload: RefPayload) -> None:
        """Refuse a ref of another (exited) process and a closed workspace."""
        await anyio.lowlevel.checkpoint()
        _find(payload)

    async def build(self, ctx: BuildContext[RefPayload, None]) -> Modules:
        """The filesystem over the stored tree, and the snapshotter when declared."""
        state = _find(ctx.payload)

        def make_ref(workspace_id: str) -> WorkspaceRef:
            return ctx.stamp(RefPayload(workspace_id=workspace_id, process_token=process_token()))

        def details() -> Mapping[str, Any]:
            return {
                "provider_id": PROVIDER_ID,
                "workspace_id": f"{PROVIDER_ID}:{state.workspace_id}",
                # No commands run here: the model's paths are plain workspace paths.
                "workspace_path": "/",
                "used_bytes": state.tree.used_bytes,
                "file_bytes": state.tree.file_bytes,
                "max_workspace_bytes": state.limits.max_workspace_bytes,
                "snapshots": len(state.snapshots),
            }

        snapshot = InMemorySnapshotter(state, make_ref) if "snapshot" in ctx.capabilities else None
        return Modules(fs=InMemoryFileSystem(state), snapshot=snapshot, details=details)

    async def destroy(self, payload: RefPayload) -> None:
        """Drop the workspace and its snapshots from the store (already gone is fine)."""
        state = find(payload.workspace_id)
        if state is not None:
            discard(state)


def _find(payload: RefPayload) -> WorkspaceState:
    if payload.process_token != process_token():
        raise WorkspaceFailedError(_LOST, provider_id=PROVIDER_ID)
    state = find(payload.workspace_id)
    if state is None:
        raise WorkspaceFailedError(_GONE, provider_id=PROVIDER_ID)
    return state
