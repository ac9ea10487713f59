"""Proof that the suite bites: each deliberately broken provider fails the rule it breaks.

Every broken provider is the reference provider with one defect. The suite
runs through ``check_provider`` exactly as a third party would run it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

import corral
import corral.provider
from corral import (
    FileEntry,
    GrepResult,
    ProviderConfig,
    SessionRef,
    WorkspaceFailedError,
    WorkspaceRef,
)
from corral.capability import GrepOptions, Matcher
from corral.provider import OpenedWorkspace
from corral_conformance import ReferenceProvider, check_provider
from corral_conformance._model import FsModel
from corral_conformance._reference import _FileSystem, _Snapshotter, _State

BUDGET = 10


def _fails(factory: Callable[[], Any], *rules: str, budget: int = BUDGET, **kwargs: Any) -> None:
    report = check_provider(factory, rules=rules, max_examples=budget, shrink=False, **kwargs)
    for rule in rules:
        result = report.result(rule)
        assert result.status == "fail", f"{rule} did not catch the defect: {result}"
        assert result.reason, f"{rule} failed without a reason"
    assert not report.ok
    assert report.exit_code != 0


# -- rule 1: sessions ------------------------------------------------------------


class SharedFilesProvider(ReferenceProvider):
    """Every session writes into one tree."""

    shared = FsModel()

    def new_state(self, model: FsModel | None = None) -> _State:
        state = super().new_state(model)
        state.model = self.shared
        return state


class SharedSnapshotsProvider(ReferenceProvider):
    """Every session shares one snapshot table."""

    def __init__(self) -> None:
        super().__init__()
        self._table: dict[str, Any] = {}

    def new_state(self, model: FsModel | None = None) -> _State:
        state = super().new_state(model)
        state.snapshots = self._table
        return state


def test_leaking_files_fail_session_rules() -> None:
    _fails(SharedFilesProvider, "sessions_do_not_share_files", "interleaved_sessions_stay_isolated")


def test_leaking_snapshots_fail_session_rule() -> None:
    _fails(SharedSnapshotsProvider, "sessions_do_not_share_snapshots")


# -- rule 2: declared ⊆ populated ------------------------------------------------


class LyingRefProvider(ReferenceProvider):
    """Ignores ``declared`` and claims ``shell`` in every ref without building it."""

    def ref_of(self, state: _State) -> WorkspaceRef:
        ref = super().ref_of(state)
        return attrs.evolve(ref, capabilities=ref.capabilities | {"shell"})

    async def open(
        self, config: ProviderConfig, session: SessionRef, declared: frozenset[str] | None = None
    ) -> OpenedWorkspace:
        return await super().open(config, session, None)


class LazySnapshotProvider(ReferenceProvider):
    """Builds the snapshot module at open but forgets it on resolve."""

    async def resolve(self, ref: WorkspaceRef) -> corral.provider.ModularWorkspace:
        ws = await super().resolve(ref)
        return corral.provider.ModularWorkspace(ws.id, fs=ws.fs, on_close=ws.close)


def test_lying_ref_fails_declared_rules() -> None:
    _fails(
        LyingRefProvider, "declared_capabilities_are_populated", "undeclared_open_populates_its_ref"
    )


def test_module_missing_at_resolve_fails_declared_rule() -> None:
    _fails(LazySnapshotProvider, "declared_capabilities_are_populated")


# -- rule 3: versions ------------------------------------------------------------


class WrongStampProvider(ReferenceProvider):
    """Stamps N-1 on new refs."""

    def ref_of(self, state: _State) -> WorkspaceRef:
        return attrs.evolve(super().ref_of(state), schema_version=self.schema_version - 1)


class AnyVersionProvider(ReferenceProvider):
    """Never checks the version."""

    async def resolve(self, ref: WorkspaceRef) -> corral.provider.ModularWorkspace:
        return await super().resolve(attrs.evolve(ref, schema_version=None))


class OnlyCurrentProvider(ReferenceProvider):
    """Refuses N-1 and None."""

    async def resolve(self, ref: WorkspaceRef) -> corral.provider.ModularWorkspace:
        if ref.schema_version != self.schema_version:
            raise WorkspaceFailedError(f"unsupported version; supports {self.schema_version} only")
        return await super().resolve(ref)


class VagueVersionProvider(ReferenceProvider):
    """Refuses bad versions without naming the supported set."""

    async def resolve(self, ref: WorkspaceRef) -> corral.provider.ModularWorkspace:
        if ref.schema_version not in (None, 1, 2):
            raise WorkspaceFailedError("unsupported version")
        return await super().resolve(ref)


def test_wrong_stamp_fails_version_rule() -> None:
    _fails(WrongStampProvider, "ref_stamps_current_schema_version")


def test_accepting_any_version_fails_version_rule() -> None:
    _fails(AnyVersionProvider, "resolve_rejects_unsupported_versions")


def test_refusing_previous_version_fails_version_rule() -> None:
    _fails(OnlyCurrentProvider, "resolve_accepts_supported_versions")


def test_vague_version_error_fails_version_rule() -> None:
    _fails(VagueVersionProvider, "resolve_rejects_unsupported_versions")


# -- rule 4: round trip and secrets ----------------------------------------------


class SecretRefProvider(ReferenceProvider):
    """Copies the session's agent id and the options into the ref."""

    async def open(
        self, config: ProviderConfig, session: SessionRef, declared: frozenset[str] | None = None
    ) -> OpenedWorkspace:
        opened = await super().open(config, session, declared)
        payload = {**opened.ref.payload, "agent": session.agent_id, "opts": dict(config.options)}
        return attrs.evolve(opened, ref=attrs.evolve(opened.ref, payload=payload))

    async def resolve(self, ref: WorkspaceRef) -> corral.provider.ModularWorkspace:
        payload = {k: v for k, v in ref.payload.items() if k not in ("agent", "opts")}
        return await super().resolve(attrs.evolve(ref, payload=payload))


class LiveObjectRefProvider(ReferenceProvider):
    """Puts a Path object in the payload."""

    def ref_of(self, state: _State) -> WorkspaceRef:
        ref = super().ref_of(state)
        return attrs.evolve(ref, payload={**ref.payload, "where": Path("/tmp")})


class FreshOnResolveProvider(ReferenceProvider):
    """Resolve hands back a brand-new empty workspace."""

    async def resolve(self, ref: WorkspaceRef) -> corral.provider.ModularWorkspace:
        await super().resolve(ref)
        return self._workspace(self.new_state())


def test_secret_in_ref_fails_secret_rule() -> None:
    _fails(SecretRefProvider, "ref_holds_no_secrets")


def test_live_object_in_ref_fails_round_trip() -> None:
    _fails(LiveObjectRefProvider, "ref_json_round_trip")


def test_empty_resolve_fails_round_trip() -> None:
    _fails(FreshOnResolveProvider, "ref_json_round_trip")


# -- rule 5: hostile refs --------------------------------------------------------


class ForeignFriendlyProvider(ReferenceProvider):
    """Accepts refs of any provider."""

    async def resolve(self, ref: WorkspaceRef) -> corral.provider.ModularWorkspace:
        return await super().resolve(attrs.evolve(ref, provider_id=self.provider_id))


class EchoingProvider(ReferenceProvider):
    """Rejects junk, but quotes it back."""

    async def resolve(self, ref: WorkspaceRef) -> corral.provider.ModularWorkspace:
        try:
            return await super().resolve(ref)
        except WorkspaceFailedError:
            raise WorkspaceFailedError(f"bad payload {dict(ref.payload)!r}") from None


class LenientPayloadProvider(ReferenceProvider):
    """Reads the one key it needs and ignores everything else."""

    async def resolve(self, ref: WorkspaceRef) -> corral.provider.ModularWorkspace:
        corral.provider.check_ref(ref, provider_id=self.provider_id, current=self.schema_version)
        wid = ref.payload.get("workspace_id")
        state = self._states.get(wid) if isinstance(wid, str) else None
        if state is None:
            raise WorkspaceFailedError("the workspace is gone")
        return self._workspace(state)


def test_accepting_foreign_refs_fails_foreign_rule() -> None:
    _fails(ForeignFriendlyProvider, "foreign_ref_rejected")


def test_echoing_junk_fails_junk_rule() -> None:
    _fails(EchoingProvider, "junk_payload_rejected")


def test_ignoring_extra_payload_keys_fails_junk_rule() -> None:
    _fails(LenientPayloadProvider, "junk_payload_rejected")


# -- rule 6: the file-system model -------------------------------------------------


class _Tweaked(ReferenceProvider):
    """A reference provider whose fs is wrapped by ``fs_class``."""

    fs_class: type[_FileSystem] = _FileSystem

    def _workspace(self, state: _State) -> corral.provider.ModularWorkspace:
        ws = super()._workspace(state)
        return corral.provider.ModularWorkspace(
            ws.id, fs=self.fs_class(state), snapshot=ws.snapshot, on_close=ws.close
        )


class _UnsortedLs(_FileSystem):
    async def ls(self, path: str = "/") -> Sequence[FileEntry]:
        return list(reversed(await super().ls(path)))


class _NeverTruncated(_FileSystem):
    async def grep(self, matcher: Matcher, options: GrepOptions) -> GrepResult:
        return attrs.evolve(await super().grep(matcher, options), truncated=False)


class _CountsOne(_FileSystem):
    async def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        await super().edit_file(path, old_text, new_text, replace_all=replace_all)
        return 1


class _GlobFilesOnly(_FileSystem):
    async def glob(self, pattern: str, path: str = "/") -> Sequence[str]:
        found = await super().glob(pattern, path)
        kept = []
        for p in found:
            if (await self.stat(p)).type == "file":
                kept.append(p)
        return kept


class _RmIgnoresContents(_FileSystem):
    async def rm(self, path: str, *, recursive: bool = False) -> None:
        await super().rm(path, recursive=True)


@pytest.mark.parametrize(
    "fs_class", [_UnsortedLs, _NeverTruncated, _CountsOne, _GlobFilesOnly, _RmIgnoresContents]
)
def test_fs_defects_fail_the_model_rule(fs_class: type[_FileSystem]) -> None:
    provider = type(f"Broken{fs_class.__name__}", (_Tweaked,), {"fs_class": fs_class})
    _fails(provider, "fs_matches_reference_model", budget=40)


# -- rule 7: containment ------------------------------------------------------------


class _SharedRoot:
    """One tree for every workspace, each under ``/<id>``; ``..`` resolved naively."""

    tree = FsModel()


class _NaiveFs(_FileSystem):
    def _real(self, path: str) -> str:
        return posixpath.normpath(f"/{self._state.workspace_id}/{path}")

    async def read_file(self, path: str) -> bytes:
        return _SharedRoot.tree.read_file(self._real(path))

    async def write_file(self, path: str, data: bytes) -> None:
        _SharedRoot.tree.write_file(self._real(path), data)

    async def ls(self, path: str = "/") -> Sequence[FileEntry]:
        return _SharedRoot.tree.ls(self._real(path))

    async def grep(self, matcher: Matcher, options: GrepOptions) -> GrepResult:
        where = attrs.evolve(options, path=self._real(options.path))
        return _SharedRoot.tree.grep(matcher, where)


class EscapingProvider(_Tweaked):
    """Sibling workspaces are one ``..`` away."""

    fs_class = _NaiveFs

    def new_state(self, model: FsModel | None = None) -> _State:
        state = super().new_state(model)
        _SharedRoot.tree.mkdir(f"/{state.workspace_id}")
        return state


def test_escaping_to_another_session_fails_containment() -> None:
    _fails(EscapingProvider, "paths_stay_inside_workspace")


class _HostFs(_FileSystem):
    """Files in a host directory, joined without any containment check."""

    def __init__(self, state: _State, root: Path) -> None:
        super().__init__(state)
        self.root = root

    async def read_file(self, path: str) -> bytes:
        try:
            return (self.root / path.lstrip("/")).read_bytes()
        except OSError as exc:
            raise corral.OperationError("cannot read", code="not_found") from exc

    async def write_file(self, path: str, data: bytes) -> None:
        target = self.root / path.lstrip("/")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        except (OSError, ValueError) as exc:
            raise corral.OperationError("cannot write", code="failed") from exc

    async def ls(self, path: str = "/") -> Sequence[FileEntry]:
        try:
            return [
                FileEntry(name=p.name, path=f"/{p.name}", type="dir" if p.is_dir() else "file")
                for p in sorted((self.root / path.lstrip("/")).iterdir())
            ]
        except (OSError, ValueError) as exc:
            raise corral.OperationError("cannot list", code="not_found") from exc


class HostDirProvider(_Tweaked):
    """Workspaces in host directories that trust every path."""

    def __init__(self, base: Path) -> None:
        super().__init__()
        self.base = base

    def _workspace(self, state: _State) -> corral.provider.ModularWorkspace:
        root = self.base / state.workspace_id
        root.mkdir(exist_ok=True)
        ws = super()._workspace(state)
        return corral.provider.ModularWorkspace(
            ws.id, fs=_HostFs(state, root), on_close=ws.close, details=lambda: {"root": str(root)}
        )


def test_host_escape_fails_containment(tmp_path: Path) -> None:
    base = tmp_path / "workspaces"
    base.mkdir()
    _fails(lambda: HostDirProvider(base), "paths_stay_inside_workspace", "symlinks_do_not_escape")


# -- rule 9: snapshots ----------------------------------------------------------------


class _MergingRestore(_Snapshotter):
    async def restore(self, snapshot_id: str) -> WorkspaceRef:
        saved = self._get(snapshot_id)
        for path, data in saved.dump().items():
            if data is not None:
                self._state.model.write_file(path, data)
        return self._provider.ref_of(self._state)


class _BranchInPlace(_Snapshotter):
    async def branch(self, snapshot_id: str) -> WorkspaceRef:
        return await self.restore(snapshot_id)


class _DeleteNothing(_Snapshotter):
    async def delete(self, snapshot_id: str) -> None:
        self._get(snapshot_id)


def _snap_provider(snap_class: type[_Snapshotter]) -> type[ReferenceProvider]:
    def _workspace(self: ReferenceProvider, state: _State) -> corral.provider.ModularWorkspace:
        ws = ReferenceProvider._workspace(self, state)
        return corral.provider.ModularWorkspace(
            ws.id, fs=ws.fs, snapshot=snap_class(self, state), on_close=ws.close
        )

    return type(f"Broken{snap_class.__name__}", (ReferenceProvider,), {"_workspace": _workspace})


@pytest.mark.parametrize(
    ("snap_class", "rule"),
    [
        (_MergingRestore, "restore_brings_back_snapshot_state"),
        (_BranchInPlace, "branch_is_a_separate_workspace"),
        (_DeleteNothing, "delete_removes_snapshot"),
    ],
)
def test_snapshot_defects_fail_snapshot_rules(snap_class: type[_Snapshotter], rule: str) -> None:
    _fails(_snap_provider(snap_class), rule)


# -- rule 10: lifecycle ---------------------------------------------------------------


class EmptyAfterCloseProvider(ReferenceProvider):
    """Resolve of a closed workspace returns an empty one."""

    async def resolve(self, ref: WorkspaceRef) -> corral.provider.ModularWorkspace:
        try:
            return await super().resolve(ref)
        except WorkspaceFailedError:
            return self._workspace(self.new_state())


class NeverClosedProvider(ReferenceProvider):
    """Close releases nothing: modules keep working."""

    def _workspace(self, state: _State) -> corral.provider.ModularWorkspace:
        ws = super()._workspace(state)
        return corral.provider.ModularWorkspace(ws.id, fs=ws.fs, snapshot=ws.snapshot)


class CloseOnceProvider(ReferenceProvider):
    """A second close raises."""

    def _workspace(self, state: _State) -> Any:
        ws = super()._workspace(state)
        closed: list[bool] = []

        class Once:
            id = ws.id
            fs, shell, code, script, snapshot = ws.fs, None, None, None, ws.snapshot
            module = staticmethod(ws.module)

            async def close(self) -> None:
                if closed:
                    raise RuntimeError("already closed")
                closed.append(True)
                await ws.close()

        return Once()


def test_empty_resolve_after_close_fails_lifecycle_rule() -> None:
    _fails(EmptyAfterCloseProvider, "resolve_after_close_reports_gone")


def test_working_after_close_fails_lifecycle_rule() -> None:
    _fails(NeverClosedProvider, "operations_after_close_fail_cleanly")


def test_double_close_failure_fails_lifecycle_rule() -> None:
    _fails(CloseOnceProvider, "close_is_idempotent")


# -- the yardstick ----------------------------------------------------------------------


def test_reference_provider_passes_every_rule() -> None:
    report = check_provider(ReferenceProvider, max_examples=BUDGET)
    assert report.ok, report.format_table()
    statuses = {r.rule: r.status for r in report.results}
    assert statuses["fs_matches_reference_model"] == "pass"
    assert statuses["shell_exit_codes"] == "skip"
    assert "does not advertise shell" in report.result("shell_exit_codes").reason
    assert len(report.results) >= 30
