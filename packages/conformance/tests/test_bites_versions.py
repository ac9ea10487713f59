"""Proof that the versions rules bite: one realistic defect per rule.

Each broken provider is the conformance reference provider (or local-bash,
for the rule that needs a shell) whose ``corral.provider.Versions`` module carries ONE
defect a version-store author could plausibly ship: a restore that only
writes what the version holds, a diff that compares sizes, a "version read"
that reads the live file, a branch that shares the origin's tree. Each case
runs the versions rules through ``check_provider`` and asserts that the
intended rules fail and no other versions rule does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

import corral
import corral.provider
from corral import ProviderConfig, SessionRef, VersionChange, WorkspaceRef
from corral.provider import OpenedWorkspace
from corral_conformance import ReferenceProvider, check_provider

VERSIONS_RULES = ("snapshot.versions",)


class _Versions:
    """The inner provider's snapshot module; the subclass overrides one method."""

    def __init__(self, inner: Any, ws: Any) -> None:
        self.inner = inner
        self.ws = ws

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def snapshot(self, label: str | None = None) -> corral.SnapshotInfo:
        return await self.inner.snapshot(label)  # type: ignore[no-any-return]

    async def restore(self, snapshot_id: str) -> WorkspaceRef:
        return await self.inner.restore(snapshot_id)  # type: ignore[no-any-return]

    async def list(self) -> Sequence[corral.SnapshotInfo]:
        return await self.inner.list()  # type: ignore[no-any-return]

    async def delete(self, snapshot_id: str) -> None:
        await self.inner.delete(snapshot_id)

    async def branch(self, snapshot_id: str) -> WorkspaceRef:
        return await self.inner.branch(snapshot_id)  # type: ignore[no-any-return]

    async def read_file_at(
        self, snapshot_id: str, path: str, *, max_bytes: int | None = None
    ) -> bytes:
        return await self.inner.read_file_at(snapshot_id, path, max_bytes=max_bytes)  # type: ignore[no-any-return]

    async def ls_at(self, snapshot_id: str, path: str = "/") -> Sequence[corral.FileEntry]:
        return await self.inner.ls_at(snapshot_id, path)  # type: ignore[no-any-return]

    async def stat_at(self, snapshot_id: str, path: str) -> corral.FileStat:
        return await self.inner.stat_at(snapshot_id, path)  # type: ignore[no-any-return]

    async def grep_at(self, snapshot_id: str, matcher: Any, options: Any) -> corral.GrepResult:
        return await self.inner.grep_at(snapshot_id, matcher, options)  # type: ignore[no-any-return]

    async def diff(self, a: str, b: str | None = None) -> Sequence[VersionChange]:
        return await self.inner.diff(a, b)  # type: ignore[no-any-return]


class _Broken:
    """A provider whose workspaces' snapshot module is ``versions(inner, workspace)``."""

    def __init__(self, make_inner: Callable[[], Any], versions: type[_Versions]) -> None:
        self._inner = make_inner()
        self._versions = versions

    provider_id = property(lambda self: self._inner.provider_id)
    capabilities = property(lambda self: self._inner.capabilities)
    schema_version = property(lambda self: self._inner.schema_version)

    def _wrap(self, ws: Any) -> corral.provider.ModularWorkspace:
        return corral.provider.ModularWorkspace(
            ws.id,
            fs=ws.fs,
            shell=ws.shell,
            snapshot=self._versions(ws.snapshot, ws),
            on_close=ws.close,
            details=ws.details,
        )

    async def open(
        self, config: ProviderConfig, session: SessionRef, declared: frozenset[str] | None = None
    ) -> OpenedWorkspace:
        opened = await self._inner.open(config, session, declared)
        return OpenedWorkspace(workspace=self._wrap(opened.workspace), ref=opened.ref)

    async def resolve(self, ref: WorkspaceRef) -> corral.provider.ModularWorkspace:
        return self._wrap(await self._inner.resolve(ref))


class _RestoreLeavesExtras(_Versions):
    """Restore writes back every file of the version but removes nothing added since."""

    async def restore(self, snapshot_id: str) -> WorkspaceRef:
        fs = self.ws.fs
        stack = ["/"]
        while stack:
            path = stack.pop()
            for entry in await self.inner.ls_at(snapshot_id, path):
                if entry.type == "dir":
                    await fs.mkdir(entry.path, parents=True)
                    stack.append(entry.path)
                else:
                    data = await self.inner.read_file_at(snapshot_id, entry.path)
                    try:
                        await fs.write_file(entry.path, data)
                    except corral.OperationError:
                        await fs.rm(entry.path, recursive=True)
                        await fs.write_file(entry.path, data)
        return self.ws_ref()

    def ws_ref(self) -> WorkspaceRef:
        return self.inner._provider.ref_of(self.inner._state)  # type: ignore[no-any-return]


class _DiffWithoutSizes(_Versions):
    """diff names the right entries but never says how big they were or are."""

    async def diff(self, a: str, b: str | None = None) -> Sequence[VersionChange]:
        return [
            VersionChange(c.path, c.change, c.type, None, None) for c in await self.inner.diff(a, b)
        ]


class _DiffBySize(_Versions):
    """diff compares sizes, so a chmod (or a same-size edit) is no change."""

    async def diff(self, a: str, b: str | None = None) -> Sequence[VersionChange]:
        return [
            c
            for c in await self.inner.diff(a, b)
            if c.change != "modified" or c.old_size != c.new_size
        ]


class _ReadsTheLiveFile(_Versions):
    """read_file_at checks the version has the path, then reads the live workspace."""

    async def read_file_at(
        self, snapshot_id: str, path: str, *, max_bytes: int | None = None
    ) -> bytes:
        await self.inner.read_file_at(snapshot_id, path, max_bytes=max_bytes)
        try:
            return await self.ws.fs.read_file(path, max_bytes=max_bytes)  # type: ignore[no-any-return]
        except corral.OperationError:
            return await self.inner.read_file_at(snapshot_id, path, max_bytes=max_bytes)  # type: ignore[no-any-return]


class _BranchSharesTheTree(_Versions):
    """branch restores the version and hands back the origin's own ref."""

    async def branch(self, snapshot_id: str) -> WorkspaceRef:
        return await self.inner.restore(snapshot_id)  # type: ignore[no-any-return]


class _IgnoresMaxBytes(_Versions):
    """read_file_at returns the whole file whatever max_bytes says."""

    async def read_file_at(
        self, snapshot_id: str, path: str, *, max_bytes: int | None = None
    ) -> bytes:
        return await self.inner.read_file_at(snapshot_id, path)  # type: ignore[no-any-return]


class _ServesDamagedFromTheLiveTree(_Versions):
    """read_file_at "heals" a damaged version by answering with the live file instead."""

    async def read_file_at(
        self, snapshot_id: str, path: str, *, max_bytes: int | None = None
    ) -> bytes:
        try:
            return await self.inner.read_file_at(snapshot_id, path, max_bytes=max_bytes)  # type: ignore[no-any-return]
        except corral.OperationError as exc:
            if exc.code != "failed":
                raise
            return await self.ws.fs.read_file(path, max_bytes=max_bytes)  # type: ignore[no-any-return]


class _BestEffortRestore(_Versions):
    """restore skips what it cannot restore and reports success."""

    async def restore(self, snapshot_id: str) -> WorkspaceRef:
        try:
            return await self.inner.restore(snapshot_id)  # type: ignore[no-any-return]
        except corral.OperationError as exc:
            if exc.code != "failed":
                raise
            return self.inner._make_ref(self.inner._name)  # type: ignore[no-any-return]


def _local_bash() -> Any:
    from corral_local_bash import LocalBashProvider

    return LocalBashProvider()


_CASES: list[tuple[type[_Versions], Callable[[], Any], tuple[str, ...]]] = [
    (
        _RestoreLeavesExtras,
        ReferenceProvider,
        ("restore_by_difference_is_exact", "reading_a_version_equals_restoring_it"),
    ),
    (_DiffWithoutSizes, ReferenceProvider, ("diff_lists_exactly_what_changed",)),
    (_DiffBySize, _local_bash, ("restore_by_difference_brings_back_modes",)),
    (
        _ReadsTheLiveFile,
        ReferenceProvider,
        ("reading_a_version_equals_restoring_it", "branch_and_origin_never_change_the_version"),
    ),
    (_BranchSharesTheTree, ReferenceProvider, ("branch_and_origin_never_change_the_version",)),
    (_IgnoresMaxBytes, ReferenceProvider, ("reading_versions_reports_errors",)),
    (_ServesDamagedFromTheLiveTree, _local_bash, ("damaged_versions_fail_cleanly",)),
    (_BestEffortRestore, _local_bash, ("damaged_versions_fail_cleanly",)),
]


@pytest.mark.parametrize(
    ("versions", "inner", "intended"), _CASES, ids=[c[0].__name__ for c in _CASES]
)
def test_versions_defect_fails_its_rule(
    versions: type[_Versions], inner: Callable[[], Any], intended: tuple[str, ...]
) -> None:
    report = check_provider(
        lambda: _Broken(inner, versions),  # type: ignore[arg-type,return-value]
        rules=VERSIONS_RULES,
        shrink=False,
    )
    for name in intended:
        result = report.result(name)
        assert result.status == "fail", f"{name} did not catch the defect: {result}"
        assert result.reason, f"{name} failed without a reason"
    failed = {r.rule for r in report.failed}
    extra = failed - set(intended)
    assert not extra, f"expected exactly {sorted(intended)} to fail, also failed: {sorted(extra)}"


@pytest.mark.parametrize("inner", [ReferenceProvider, _local_bash], ids=["reference", "local-bash"])
def test_the_unbroken_providers_pass_every_versions_rule(inner: Callable[[], Any]) -> None:
    report = check_provider(lambda: _Broken(inner, _Versions), rules=VERSIONS_RULES)  # type: ignore[arg-type,return-value]
    assert report.ok, [f"{r.rule}: {r.reason}" for r in report.failed]
    ran = {r.rule for r in report.results if r.status == "pass"}
    wanted = {name for _, make, names in _CASES if make is inner for name in names}
    assert wanted <= ran, sorted(ran)
