"""A small correct provider (fs + snapshot, with :class:`corral.provider.Versions`).

It runs over the reference model and is the yardstick the suite is tested
against, and the shortest example of a provider that passes: per-session
state lives in the workspace's ``_State``; the provider only keeps an index
from unguessable workspace ids to live states so that ``resolve`` can
re-attach them.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Final

import attrs

import corral
import corral.provider
from corral import (
    FileEntry,
    FileStat,
    GrepResult,
    OperationError,
    ProviderConfig,
    SessionRef,
    SnapshotInfo,
    VersionChange,
    WorkspaceFailedError,
    WorkspaceRef,
)
from corral.capability import GrepOptions, Matcher
from corral.provider import OpenedWorkspace

from ._model import FsModel, ModelError

__all__ = ["ReferenceProvider"]

_KIND: Final = "conformance-reference"


@attrs.frozen
class _Payload:
    workspace_id: str


@attrs.define(eq=False)
class _State:
    workspace_id: str
    model: FsModel = attrs.field(factory=FsModel)
    snapshots: dict[str, tuple[SnapshotInfo, FsModel]] = attrs.field(factory=dict)
    closed: bool = False
    # FileStat.mtime per written path (the model keeps content only); others: creation time.
    mtimes: dict[str, float] = attrs.field(factory=dict)
    born: float = attrs.field(factory=time.time)

    def check(self) -> FsModel:
        if self.closed:
            raise corral.provider.workspace_closed()
        return self.model


def _plain(exc: ModelError) -> OperationError:
    return OperationError(exc.message, code=exc.code)


class _FileSystem:
    def __init__(self, state: _State) -> None:
        self._state = state

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        try:
            return self._state.check().read_file(path, max_bytes=max_bytes)
        except ModelError as exc:
            raise _plain(exc) from None

    async def write_file(self, path: str, data: bytes) -> None:
        try:
            self._state.check().write_file(path, data)
        except ModelError as exc:
            raise _plain(exc) from None
        self._state.mtimes[corral.provider.normalize_path(path)] = time.time()

    async def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        try:
            count = self._state.check().edit_file(path, old_text, new_text, replace_all=replace_all)
        except ModelError as exc:
            raise _plain(exc) from None
        self._state.mtimes[corral.provider.normalize_path(path)] = time.time()
        return count

    async def ls(self, path: str = "/") -> Sequence[FileEntry]:
        try:
            return self._state.check().ls(path)
        except ModelError as exc:
            raise _plain(exc) from None

    async def glob(self, pattern: str, path: str = "/") -> Sequence[str]:
        try:
            return self._state.check().glob(pattern, path)
        except ModelError as exc:
            raise _plain(exc) from None

    async def grep(self, matcher: Matcher, options: GrepOptions) -> GrepResult:
        try:
            return self._state.check().grep(matcher, options)
        except ModelError as exc:
            raise _plain(exc) from None

    async def stat(self, path: str) -> FileStat:
        try:
            got = self._state.check().stat(path)
        except ModelError as exc:
            raise _plain(exc) from None
        mode = 0o644 if got.type == "file" else 0o755
        return attrs.evolve(
            got, mtime=self._state.mtimes.get(got.path, self._state.born), mode=mode
        )

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        try:
            self._state.check().mkdir(path, parents=parents)
        except ModelError as exc:
            raise _plain(exc) from None

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        try:
            self._state.check().rm(path, recursive=recursive)
        except ModelError as exc:
            raise _plain(exc) from None


class _Snapshotter:
    def __init__(self, provider: ReferenceProvider, state: _State) -> None:
        self._provider = provider
        self._state = state

    def _get(self, snapshot_id: str) -> FsModel:
        self._state.check()
        try:
            return self._state.snapshots[snapshot_id][1]
        except KeyError:
            raise OperationError("no such snapshot", code="not_found") from None

    async def snapshot(self, label: str | None = None) -> SnapshotInfo:
        model = self._state.check()
        info = SnapshotInfo(snapshot_id=secrets.token_hex(8), created_at=time.time(), label=label)
        self._state.snapshots[info.snapshot_id] = (info, model.copy())
        return info

    async def restore(self, snapshot_id: str) -> WorkspaceRef:
        self._state.model = self._get(snapshot_id).copy()
        return self._provider.ref_of(self._state)

    async def list(self) -> Sequence[SnapshotInfo]:
        self._state.check()
        return [info for info, _ in self._state.snapshots.values()]

    async def delete(self, snapshot_id: str) -> None:
        self._get(snapshot_id)
        del self._state.snapshots[snapshot_id]

    async def branch(self, snapshot_id: str) -> WorkspaceRef:
        seed = self._get(snapshot_id).copy()
        return self._provider.ref_of(self._provider.new_state(seed))

    # -- corral.provider.Versions: a version is a frozen model, read without restoring it

    async def read_file_at(
        self, snapshot_id: str, path: str, *, max_bytes: int | None = None
    ) -> bytes:
        try:
            return self._get(snapshot_id).read_file(path, max_bytes=max_bytes)
        except ModelError as exc:
            raise _plain(exc) from None

    async def ls_at(self, snapshot_id: str, path: str = "/") -> Sequence[FileEntry]:
        try:
            return self._get(snapshot_id).ls(path)
        except ModelError as exc:
            raise _plain(exc) from None

    async def stat_at(self, snapshot_id: str, path: str) -> FileStat:
        try:
            got = self._get(snapshot_id).stat(path)
        except ModelError as exc:
            raise _plain(exc) from None
        created = self._state.snapshots[snapshot_id][0].created_at
        return attrs.evolve(got, mtime=created, mode=0o644 if got.type == "file" else 0o755)

    async def grep_at(self, snapshot_id: str, matcher: Matcher, options: GrepOptions) -> GrepResult:
        try:
            return self._get(snapshot_id).grep(matcher, options)
        except ModelError as exc:
            raise _plain(exc) from None

    async def diff(self, a: str, b: str | None = None) -> Sequence[VersionChange]:
        old = self._get(a).dump()
        new = (self._state.check() if b is None else self._get(b)).dump()
        out = []
        for path in sorted(old.keys() | new.keys()):
            was, now = old.get(path, b""), new.get(path, b"")
            size_was = 0 if was is None else len(was)
            size_now = 0 if now is None else len(now)
            if path not in new:
                out.append(VersionChange(path, "removed", _type(was), size_was, None))
            elif path not in old:
                out.append(VersionChange(path, "added", _type(now), None, size_now))
            elif was != now:  # content, or a file and a directory (None) swapped
                out.append(VersionChange(path, "modified", _type(now), size_was, size_now))
        return out


def _type(node: bytes | None) -> corral.FileType:
    return "dir" if node is None else "file"


_STATES: dict[str, _State] = {}
"""Every live reference workspace in this process, by id: process-wide, not on
the instance, so a fresh instance (as after a restart) resolves another's refs
and the provider object holds no per-session state."""


class ReferenceProvider:
    """A correct in-process provider with ``fs`` and ``snapshot``.

    Args:
        kind: The provider id it answers to.
        schema_version: The ref version N it stamps.
    """

    def __init__(self, *, kind: str = _KIND, schema_version: int = 2) -> None:
        self._kind = kind
        self._version = schema_version

    @property
    def _states(self) -> dict[str, _State]:
        """The process-wide index of live states (a view for subclasses, not instance state)."""
        return _STATES

    @property
    def provider_id(self) -> str:
        """The provider kind."""
        return self._kind

    @property
    def capabilities(self) -> frozenset[str]:
        """``fs`` and ``snapshot``."""
        return frozenset({"fs", "snapshot"})

    @property
    def schema_version(self) -> int:
        """The ref version N."""
        return self._version

    def new_state(self, model: FsModel | None = None) -> _State:
        """Register a fresh workspace state (used by ``open`` and ``branch``)."""
        state = _State(workspace_id=secrets.token_hex(16), model=model or FsModel())
        _STATES[state.workspace_id] = state
        return state

    def ref_of(self, state: _State) -> WorkspaceRef:
        """The ref of a workspace state."""
        return WorkspaceRef(
            provider_id=self._kind,
            payload=corral.provider.unstructure_payload(_Payload(state.workspace_id)),
            capabilities=self.capabilities,
            schema_version=self._version,
        )

    def _workspace(self, state: _State) -> corral.provider.ModularWorkspace:
        async def on_close() -> None:
            state.closed = True
            _STATES.pop(state.workspace_id, None)

        return corral.provider.ModularWorkspace(
            state.workspace_id,
            fs=_FileSystem(state),
            snapshot=_Snapshotter(self, state),
            on_close=on_close,
        )

    async def open(
        self,
        config: ProviderConfig,
        session: SessionRef,
        declared: frozenset[str] | None = None,
    ) -> OpenedWorkspace:
        """Create an empty workspace."""
        missing = (declared or frozenset()) - self.capabilities
        if missing:
            raise WorkspaceFailedError(
                f"{self._kind} cannot populate: {', '.join(sorted(missing))}",
                provider_id=self._kind,
            )
        state = self.new_state()
        return OpenedWorkspace(workspace=self._workspace(state), ref=self.ref_of(state))

    async def resolve(self, ref: WorkspaceRef) -> corral.provider.ModularWorkspace:
        """Re-attach a live workspace of this provider."""
        corral.provider.check_ref(ref, provider_id=self._kind, current=self._version)
        payload = corral.provider.structure_payload(ref.payload, _Payload, provider_id=self._kind)
        state = _STATES.get(payload.workspace_id)
        if state is None or state.closed:
            raise WorkspaceFailedError("the workspace is gone", provider_id=self._kind)
        return self._workspace(state)
