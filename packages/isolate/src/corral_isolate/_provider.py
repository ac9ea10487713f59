"""The ``isolate`` provider: workspaces whose only module is the ``script`` runner."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Mapping
from typing import Any, Final

import anyio.lowlevel
import attrs

from corral.provider import (
    BuildContext,
    Modules,
    OpenedWorkspace,
    ProviderConfig,
    SessionRef,
    Workspace,
    WorkspaceAssembly,
    WorkspaceFailedError,
    WorkspaceRef,
)

from ._engine import EnginePool
from ._runner import LANGUAGES, ScriptLimits, ScriptRunner

__all__ = ["PROVIDER_ID", "SCHEMA_VERSION", "SUPPORTED_CAPABILITIES", "IsolateProvider"]

PROVIDER_ID: Final = "isolate"
SCHEMA_VERSION: Final = 1
SUPPORTED_CAPABILITIES: Final = frozenset({"script"})
_PROCESS: Final = secrets.token_hex(16)
"""Tells this process's refs from another's."""

_GONE: Final = (
    "the isolate workspace is gone: it was closed, or it was opened by another process "
    "(isolate workspaces hold no data and live in the process that opened them)"
)


@attrs.frozen
class RefPayload:
    """The ref payload: which workspace, opened by which process."""

    workspace_id: str = attrs.field(validator=attrs.validators.matches_re(r"iso-[0-9a-f]{32}"))
    process_token: str = attrs.field(validator=attrs.validators.matches_re(r"[0-9a-f]{32}"))

    @property
    def workspace(self) -> str:
        """The workspace's name; its id is ``isolate:<name>``."""
        return self.workspace_id


class _Live:
    """Ids of this process's open isolate workspaces (nothing else is kept)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: set[str] = set()

    def add(self, workspace_id: str) -> None:
        with self._lock:
            self._ids.add(workspace_id)

    def discard(self, workspace_id: str) -> None:
        with self._lock:
            self._ids.discard(workspace_id)

    def __contains__(self, workspace_id: object) -> bool:
        with self._lock:
            return workspace_id in self._ids


_LIVE: Final = _Live()
_POOLS: dict[int, EnginePool] = {}
_POOLS_LOCK: Final = threading.Lock()


def _pool(max_wasm_stack_bytes: int) -> EnginePool:
    """One engine pool per stack size, shared by every provider instance."""
    with _POOLS_LOCK:
        pool = _POOLS.get(max_wasm_stack_bytes)
        if pool is None:
            pool = _POOLS[max_wasm_stack_bytes] = EnginePool(max_wasm_stack=max_wasm_stack_bytes)
        return pool


class IsolateProvider:
    """Ephemeral JavaScript in WebAssembly: the ``script`` capability and nothing else.

    Each ``script`` call runs in a fresh QuickJS-NG instance inside wasmtime,
    in this process, with no file system, no network and no state from
    earlier calls (see :class:`corral_isolate.ScriptRunner`). A workspace
    holds no data; its ref resolves in the process that opened it until it
    is closed.

    Args:
        memory_bytes: Linear memory of one isolate (at least 16 MiB).
        max_output_bytes: Cap of stdout, stderr and the result's JSON, each.
        max_timeout_s: Ceiling of a run's timeout.
        max_wasm_stack_bytes: Native stack one script may use.

    Raises:
        ValueError: A limit is out of range.
    """

    def __init__(
        self,
        *,
        memory_bytes: int = 64 << 20,
        max_output_bytes: int = 1 << 20,
        max_timeout_s: float = 60.0,
        max_wasm_stack_bytes: int = 512 * 1024,
    ) -> None:
        self._limits = ScriptLimits(
            memory_bytes=memory_bytes,
            max_output_bytes=max_output_bytes,
            max_timeout_s=max_timeout_s,
            max_wasm_stack_bytes=max_wasm_stack_bytes,
        )
        self._pool = _pool(max_wasm_stack_bytes)
        # script is built whatever is declared: it is all an isolate workspace is.
        self._assembly = WorkspaceAssembly(
            _IsolateBuilder(self._pool, self._limits),
            provider_id=PROVIDER_ID,
            capabilities=SUPPORTED_CAPABILITIES,
            schema_version=SCHEMA_VERSION,
            payload_type=RefPayload,
            always=SUPPORTED_CAPABILITIES,
        )

    @property
    def provider_id(self) -> str:
        """Always ``isolate``."""
        return PROVIDER_ID

    @property
    def capabilities(self) -> frozenset[str]:
        """``script``."""
        return SUPPORTED_CAPABILITIES

    @property
    def schema_version(self) -> int:
        """The current ref payload version (refs of ``None`` and 1 resolve)."""
        return SCHEMA_VERSION

    @property
    def limits(self) -> ScriptLimits:
        """The bounds of every script run."""
        return self._limits

    def warm(self) -> None:
        """Compile the engine now (about half a second, blocking) instead of on first use."""
        self._pool.warm()

    async def open(
        self,
        config: ProviderConfig,
        session: SessionRef,
        declared: frozenset[str] | None = None,
    ) -> OpenedWorkspace:
        """Create a workspace whose only module is ``script``.

        Raises:
            WorkspaceFailedError: ``declared`` names another capability, or
                the config carries per-session options.
        """
        return await self._assembly.open(config, session, declared)

    async def resolve(self, ref: WorkspaceRef) -> Workspace:
        """Re-attach an open workspace of this process.

        Raises:
            WorkspaceFailedError: The ref is foreign, malformed or of an
                unsupported version, was made by another process, or its
                workspace was closed.
        """
        if not isinstance(ref, WorkspaceRef):
            raise WorkspaceFailedError("workspace ref is malformed", provider_id=PROVIDER_ID)
        return await self._assembly.resolve(ref)

    def __repr__(self) -> str:
        return f"IsolateProvider({self._limits})"


class _IsolateBuilder:
    """The parts of an isolate workspace: a live id in this process and a script runner."""

    def __init__(self, pool: EnginePool, limits: ScriptLimits) -> None:
        self._pool = pool
        self._limits = limits

    async def create(
        self, config: ProviderConfig, session: SessionRef, capabilities: frozenset[str]
    ) -> tuple[RefPayload, None]:
        """Refuse per-session options and mark a fresh workspace id live."""
        await anyio.lowlevel.checkpoint()
        if config.options:
            raise WorkspaceFailedError(
                "the isolate provider takes no per-session options; "
                "pass limits as provider options instead",
                provider_id=PROVIDER_ID,
            )
        workspace_id = f"iso-{secrets.token_hex(16)}"
        _LIVE.add(workspace_id)
        return RefPayload(workspace_id=workspace_id, process_token=_PROCESS), None

    async def locate(self, payload: RefPayload) -> None:
        """Refuse a ref of another process or of a closed workspace."""
        await anyio.lowlevel.checkpoint()
        if payload.process_token != _PROCESS or payload.workspace_id not in _LIVE:
            raise WorkspaceFailedError(_GONE, provider_id=PROVIDER_ID)

    async def build(self, ctx: BuildContext[RefPayload, None]) -> Modules:
        """A script runner over the shared engine pool."""
        runner = ScriptRunner(self._pool, self._limits)
        ctx.releases.callback(runner.close)
        limits, workspace_id = self._limits, f"{PROVIDER_ID}:{ctx.payload.workspace_id}"

        def details() -> Mapping[str, Any]:
            return {
                "provider_id": PROVIDER_ID,
                "workspace_id": workspace_id,
                "languages": sorted(LANGUAGES),
                "engine": "QuickJS-NG on wasmtime (WebAssembly, in process)",
                "memory_bytes": limits.memory_bytes,
                "max_output_bytes": limits.max_output_bytes,
                "max_timeout_s": limits.max_timeout_s,
                "network": "none",
                "filesystem": "none",
            }

        return Modules(script=runner, details=details)

    async def destroy(self, payload: RefPayload) -> None:
        """Forget the workspace id: its refs stop resolving."""
        _LIVE.discard(payload.workspace_id)
