"""Proof that the fs, shell and snapshot rules bite: one realistic defect per rule.

Each broken provider is a real provider (the reference provider for fs and
snapshots, local-bash for the shell) with ONE defect a provider author could
plausibly ship. Each case runs the rules of its area through
``check_provider`` and asserts that the intended rules fail and that nothing
outside the area does.
"""

from __future__ import annotations

import importlib.util
import os
import posixpath
import sys
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

import corral
import corral.provider
from corral import (
    ExecResult,
    FileEntry,
    FileStat,
    GrepResult,
    OperationError,
    ProviderConfig,
    SessionRef,
    SnapshotInfo,
    WorkspaceRef,
)
from corral.capability import GrepOptions, Matcher
from corral.provider import CommandRequest, OpenedWorkspace
from corral_conformance import ReferenceProvider, check_provider
from corral_conformance._model import FsModel
from corral_conformance._reference import _FileSystem, _Snapshotter


def _sibling(name: str) -> Any:
    """Load a sibling test module (the suite runs with importlib import mode)."""
    qualified = f"corral_conformance_tests_{name}"
    if qualified not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            qualified, Path(__file__).with_name(f"{name}.py")
        )
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = module
        spec.loader.exec_module(module)
    return sys.modules[qualified]


_bites = _sibling("test_bites")
_snap_provider = _bites._snap_provider
_Tweaked = _bites._Tweaked
BUDGET = 10
RANDOMISED = frozenset({"fs_matches_reference_model", "restore_brings_back_snapshot_state"})
"""Rules driven by random operation sequences: they may or may not meet a given defect."""

FS_RULES = (
    "fs_basic_semantics",
    "fs_matches_reference_model",
    "fs_bytes_round_trip",
    "fs_legal_names",
    "fs_path_spellings",
    "fs_grep_boundaries",
    "fs_deep_wide_and_empty",
    "fs_glob_patterns",
    "fs_stat_fields",
)
SHELL_RULES = (
    "shell_exit_codes",
    "shell_separates_stdout_and_stderr",
    "shell_stdin",
    "shell_cwd",
    "shell_cwd_outside_workspace_rejected",
    "shell_env",
    "shell_timeout_kills_process_tree",
    "shell_output_is_capped",
    "shell_death_by_signal",
    "shell_missing_and_non_executable_programs",
    "shell_output_cap_boundaries",
    "shell_stdin_exact",
    "shell_env_exact_and_host_env_absent",
    "shell_enforces_allowed_commands",
    "shell_refuses_syntax_when_not_allowed",
    "shell_duration",
)
SNAPSHOT_RULES = (
    "restore_brings_back_snapshot_state",
    "branch_is_a_separate_workspace",
    "delete_removes_snapshot",
    "unknown_snapshot_is_not_found",
    "restore_is_exact_and_repeatable",
    "list_is_creation_order_with_labels",
    "delete_removes_exactly_one",
    "snapshot_ids_are_scoped_to_their_workspace",
)


def _fails_only(
    factory: Callable[[], Any], area: Sequence[str], *intended: str, **kwargs: Any
) -> None:
    """Exactly the intended rules fail, each with a reason; the rest of the area passes."""
    report = check_provider(factory, rules=area, max_examples=BUDGET, shrink=False, **kwargs)
    failed = {r.rule for r in report.failed}
    for name in intended:
        result = report.result(name)
        assert result.status == "fail", f"{name} did not catch the defect: {result}"
        assert result.reason, f"{name} failed without a reason"
    # The randomised model checks may catch a defect too, depending on the draw.
    extra = failed - set(intended) - RANDOMISED
    assert not extra, f"expected exactly {sorted(intended)} to fail, also failed: {sorted(extra)}"


# -- fs: one defect per rule, wrapped around the reference provider ----------------------


def _clamp(path: str) -> str:
    return posixpath.normpath("/" + path) if "\x00" not in path else path


class _TrailingSlashIsDir(_FileSystem):
    """POSIX habit: ``file/`` is not a file."""

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        if path.endswith("/"):
            raise OperationError("not a directory", code="not_a_directory")
        return await super().read_file(path, max_bytes=max_bytes)


class _ClampsDotDot(_FileSystem):
    """Clamps ``..`` at the root (``normpath``) instead of refusing it."""

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        return await super().read_file(_clamp(path), max_bytes=max_bytes)

    async def stat(self, path: str) -> FileStat:
        return await super().stat(_clamp(path))


class _NormalisesNames(_FileSystem):
    """Stores names in NFC, so an NFD name and its NFC twin collide."""

    async def write_file(self, path: str, data: bytes) -> None:
        await super().write_file(unicodedata.normalize("NFC", path), data)

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        await super().mkdir(unicodedata.normalize("NFC", path), parents=parents)


class _TextOnlyWrites(_FileSystem):
    """Writes through a text layer: invalid UTF-8 is replaced."""

    async def write_file(self, path: str, data: bytes) -> None:
        await super().write_file(path, data.decode("utf-8", "replace").encode())


class _DirectoryReadsEmpty(_FileSystem):
    """Reading a directory returns nothing instead of ``is_a_directory``."""

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        if (await self.stat(path)).type == "dir":
            return b""
        return await super().read_file(path, max_bytes=max_bytes)


class _MaxBytesOffByOne(_FileSystem):
    """``too_large`` already at exactly ``max_bytes``."""

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        data = await super().read_file(path)
        if max_bytes is not None and len(data) >= max_bytes:
            raise OperationError("too large", code="too_large")
        return data


class _WriteReplacesDirectory(_FileSystem):
    """Writing over a directory silently replaces it."""

    async def write_file(self, path: str, data: bytes) -> None:
        try:
            if (await self.stat(path)).type == "dir" and corral.provider.normalize_path(
                path
            ) != "/":
                await self.rm(path, recursive=True)
        except OperationError:
            pass
        await super().write_file(path, data)


class _ReplaceAllOnce(_FileSystem):
    """``replace_all`` replaces only the first occurrence but reports them all."""

    async def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        if not replace_all:
            return await super().edit_file(path, old_text, new_text)
        text = (await self.read_file(path)).decode("utf-8")
        count = await super().edit_file(path, old_text, new_text, replace_all=True)
        await super().write_file(path, text.replace(old_text, new_text, 1).encode())
        return count


class _EditsAnyBytes(_FileSystem):
    """Edits non-UTF-8 files through a lossy decode."""

    async def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        data = await self.read_file(path)
        text = data.decode("utf-8", "replace")
        if text.encode() != data and old_text and old_text in text:
            await self.write_file(path, text.encode())
        return await super().edit_file(path, old_text, new_text, replace_all=replace_all)


class _LsSizeZero(_FileSystem):
    """``ls`` leaves every size at its default."""

    async def ls(self, path: str = "/") -> Sequence[FileEntry]:
        return [attrs.evolve(e, size=0) for e in await super().ls(path)]


class _GlobStarStarNeedsOne(_FileSystem):
    """``**/x`` needs at least one directory (a common regex translation slip)."""

    async def glob(self, pattern: str, path: str = "/") -> Sequence[str]:
        found = await super().glob(pattern, path)
        if not pattern.startswith("**/"):
            return found
        base = corral.provider.normalize_path(path)
        depth = 0 if base == "/" else base.count("/")
        return [p for p in found if p.count("/") - depth > 1]


class _GrepZeroBasedLines(_FileSystem):
    """Line numbers start at 0."""

    async def grep(self, matcher: Matcher, options: GrepOptions) -> GrepResult:
        found = await super().grep(matcher, options)
        return attrs.evolve(
            found,
            matches=tuple(attrs.evolve(m, line_number=m.line_number - 1) for m in found.matches),
        )


class _TruncatedWhenFull(_FileSystem):
    """``truncated`` as soon as the list is full, even when nothing was cut."""

    async def grep(self, matcher: Matcher, options: GrepOptions) -> GrepResult:
        found = await super().grep(matcher, options)
        return attrs.evolve(
            found, truncated=found.truncated or len(found.matches) >= options.max_results
        )


class _StatPathAsGiven(_FileSystem):
    """``stat`` echoes the path as the caller spelled it."""

    async def stat(self, path: str) -> FileStat:
        return attrs.evolve(await super().stat(path), path=path)


class _MkdirParentsExists(_FileSystem):
    """``mkdir(parents=True)`` on an existing directory raises ``exists``."""

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        if parents:
            try:
                if (await self.stat(path)).type == "dir":
                    raise OperationError("exists", code="exists")
            except OperationError as exc:
                if exc.code == "exists":
                    raise
        await super().mkdir(path, parents=parents)


class _RmRootEmpties(_FileSystem):
    """``rm('/', recursive=True)`` empties the workspace instead of refusing."""

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        if corral.provider.normalize_path(path) == "/" and recursive:
            for entry in await self.ls("/"):
                await super().rm(entry.path, recursive=True)
            return
        await super().rm(path, recursive=recursive)


class _PrunesEmptyParents(_FileSystem):
    """Removing the last entry of a directory removes the directory too (git style)."""

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        await super().rm(path, recursive=recursive)
        parent = posixpath.dirname(corral.provider.normalize_path(path))
        while parent != "/" and not await self.ls(parent):
            await super().rm(parent)
            parent = posixpath.dirname(parent)


class _MtimeInMilliseconds(_FileSystem):
    """``stat`` reports ``mtime`` in milliseconds (a JavaScript habit)."""

    async def stat(self, path: str) -> FileStat:
        got = await super().stat(path)
        return attrs.evolve(got, mtime=got.mtime * 1000)


class _ModeWithTypeBits(_FileSystem):
    """``stat`` passes ``st_mode`` through whole, file-type bits included."""

    async def stat(self, path: str) -> FileStat:
        got = await super().stat(path)
        return attrs.evolve(got, mode=got.mode | (0o100000 if got.type == "file" else 0o40000))


class _DirectorySize4096(_FileSystem):
    """``stat`` of a directory reports the host's block size, not 0."""

    async def stat(self, path: str) -> FileStat:
        got = await super().stat(path)
        return attrs.evolve(got, size=4096) if got.type == "dir" else got


_FS_CASES: list[tuple[type[_FileSystem], tuple[str, ...]]] = [
    (_MtimeInMilliseconds, ("fs_stat_fields",)),
    (_ModeWithTypeBits, ("fs_stat_fields",)),
    (_DirectorySize4096, ("fs_stat_fields",)),
    (_TrailingSlashIsDir, ("fs_path_spellings",)),
    (_ClampsDotDot, ("fs_basic_semantics", "fs_path_spellings")),
    (_NormalisesNames, ("fs_legal_names",)),
    (_TextOnlyWrites, ("fs_basic_semantics", "fs_bytes_round_trip")),
    (_DirectoryReadsEmpty, ("fs_basic_semantics",)),
    (_MaxBytesOffByOne, ("fs_basic_semantics", "fs_bytes_round_trip")),
    (_WriteReplacesDirectory, ("fs_basic_semantics", "fs_deep_wide_and_empty")),
    (_ReplaceAllOnce, ("fs_basic_semantics", "fs_bytes_round_trip")),
    (_EditsAnyBytes, ("fs_basic_semantics", "fs_bytes_round_trip")),
    (
        _LsSizeZero,
        (
            "fs_basic_semantics",
            "fs_bytes_round_trip",
            "fs_deep_wide_and_empty",
            "fs_legal_names",
            "fs_path_spellings",
            "fs_stat_fields",
        ),
    ),
    (_GlobStarStarNeedsOne, ("fs_glob_patterns",)),
    (_GrepZeroBasedLines, ("fs_grep_boundaries", "fs_legal_names")),
    (_TruncatedWhenFull, ("fs_grep_boundaries",)),
    (_StatPathAsGiven, ("fs_legal_names", "fs_path_spellings")),
    (_MkdirParentsExists, ("fs_deep_wide_and_empty",)),
    (_RmRootEmpties, ("fs_deep_wide_and_empty",)),
    (_PrunesEmptyParents, ("fs_deep_wide_and_empty",)),
]


@pytest.mark.parametrize(
    ("fs_class", "intended"), _FS_CASES, ids=lambda v: getattr(v, "__name__", "")
)
def test_fs_defect_fails_its_rule(fs_class: type[_FileSystem], intended: tuple[str, ...]) -> None:
    provider = type(f"Broken{fs_class.__name__}", (_Tweaked,), {"fs_class": fs_class})
    _fails_only(provider, FS_RULES, *intended)


# -- snapshots: one defect per rule, wrapped around the reference provider -------------------


def _drop_empty_dirs(model: FsModel) -> FsModel:
    copy = FsModel()
    for path, data in model.dump().items():
        if data is not None:
            copy.write_file(path, data)
    return copy


class _RestoreDropsEmptyDirs(_Snapshotter):
    async def restore(self, snapshot_id: str) -> WorkspaceRef:
        self._state.model = _drop_empty_dirs(self._get(snapshot_id))
        return self._provider.ref_of(self._state)


class _RestoreReturnsStaleRef(_Snapshotter):
    """Restores into a fresh workspace but hands back the old one's ref."""

    async def restore(self, snapshot_id: str) -> WorkspaceRef:
        self._provider.new_state(self._get(snapshot_id).copy())
        return self._provider.ref_of(self._state)


class _RestoreAliasesSnapshot(_Snapshotter):
    """Restores by pointing at the stored tree instead of copying it."""

    async def restore(self, snapshot_id: str) -> WorkspaceRef:
        self._state.model = self._get(snapshot_id)
        return self._provider.ref_of(self._state)


class _ListByLabel(_Snapshotter):
    """Lists snapshots alphabetically by label."""

    async def list(self) -> Sequence[SnapshotInfo]:
        return sorted(await super().list(), key=lambda i: i.label or "")


class _EmptyLabelIsNone(_Snapshotter):
    async def snapshot(self, label: str | None = None) -> SnapshotInfo:
        return await super().snapshot(label or None)


class _BranchFromLive(_Snapshotter):
    """Branches share the origin's live tree."""

    async def branch(self, snapshot_id: str) -> WorkspaceRef:
        self._get(snapshot_id)
        return self._provider.ref_of(self._provider.new_state(self._state.model))


class _DeleteNewest(_Snapshotter):
    async def delete(self, snapshot_id: str) -> None:
        self._get(snapshot_id)
        del self._state.snapshots[list(self._state.snapshots)[-1]]


_EVERY_SNAPSHOT: dict[str, FsModel] = {}


class _GlobalSnapshotIds(_Snapshotter):
    """Looks ids up in a process-wide table, so any workspace's id restores."""

    async def snapshot(self, label: str | None = None) -> SnapshotInfo:
        info = await super().snapshot(label)
        _EVERY_SNAPSHOT[info.snapshot_id] = self._state.snapshots[info.snapshot_id][1]
        return info

    def _get(self, snapshot_id: str) -> FsModel:
        if snapshot_id in _EVERY_SNAPSHOT and snapshot_id not in self._state.snapshots:
            return _EVERY_SNAPSHOT[snapshot_id]
        return super()._get(snapshot_id)

    async def delete(self, snapshot_id: str) -> None:
        if snapshot_id in self._state.snapshots:
            await super().delete(snapshot_id)
        else:
            self._get(snapshot_id)


_SNAP_CASES: list[tuple[type[_Snapshotter], tuple[str, ...]]] = [
    (_RestoreDropsEmptyDirs, ("restore_is_exact_and_repeatable",)),
    (_RestoreReturnsStaleRef, ("restore_is_exact_and_repeatable",)),
    (_RestoreAliasesSnapshot, ("restore_is_exact_and_repeatable",)),
    (_ListByLabel, ("list_is_creation_order_with_labels",)),
    (_EmptyLabelIsNone, ("list_is_creation_order_with_labels",)),
    (_BranchFromLive, ("branch_is_a_separate_workspace",)),
    (_DeleteNewest, ("delete_removes_exactly_one", "delete_removes_snapshot")),
    (
        _GlobalSnapshotIds,
        (
            "delete_removes_exactly_one",
            "delete_removes_snapshot",
            "snapshot_ids_are_scoped_to_their_workspace",
        ),
    ),
]


@pytest.mark.parametrize(
    ("snap_class", "intended"), _SNAP_CASES, ids=lambda v: getattr(v, "__name__", "")
)
def test_snapshot_defect_fails_its_rule(
    snap_class: type[_Snapshotter], intended: tuple[str, ...]
) -> None:
    _fails_only(_snap_provider(snap_class), SNAPSHOT_RULES, *intended)


# -- shell: one defect per rule, wrapped around local-bash -------------------------------------


ShellFix = Callable[[Any, CommandRequest], Any]


class _ShellWrapper:
    """A local-bash shell with one defect in how it forwards requests or results."""

    def __init__(self, inner: Any, fix: Callable[[Any, CommandRequest], Any]) -> None:
        self._inner = inner
        self._fix = fix

    async def run(self, request: CommandRequest) -> ExecResult:
        return await self._fix(self._inner, request)  # type: ignore[no-any-return]


class _BrokenShellProvider:
    """local-bash with its shell wrapped; everything else forwarded."""

    def __init__(self, base: Path, fix: ShellFix) -> None:
        from corral_local_bash import LocalBashProvider

        self._inner = LocalBashProvider(tmpdir_root=str(base))
        self._fix = fix

    provider_id = property(lambda self: self._inner.provider_id)
    capabilities = property(lambda self: self._inner.capabilities)
    schema_version = property(lambda self: self._inner.schema_version)

    def _wrap(self, ws: Any) -> corral.provider.ModularWorkspace:
        shell = ws.shell
        return corral.provider.ModularWorkspace(
            ws.id,
            fs=ws.fs,
            shell=None if shell is None else _ShellWrapper(shell, self._fix),
            snapshot=ws.snapshot,
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


async def _nonzero_is_one(shell: Any, req: CommandRequest) -> ExecResult:
    out = await shell.run(req)
    return attrs.evolve(out, exit_code=1) if out.exit_code not in (0, None) else out


async def _signal_as_status(shell: Any, req: CommandRequest) -> ExecResult:
    out = await shell.run(req)
    return attrs.evolve(out, exit_code=128 + out.signal) if out.signal else out


async def _missing_raises(shell: Any, req: CommandRequest) -> ExecResult:
    out = await shell.run(req)
    if out.exit_code == 127:
        raise OperationError("command not found", code="not_found")
    return out


async def _cannot_exec_is_127(shell: Any, req: CommandRequest) -> ExecResult:
    out = await shell.run(req)
    return attrs.evolve(out, exit_code=127) if out.exit_code == 126 else out


async def _merges_stderr(shell: Any, req: CommandRequest) -> ExecResult:
    out = await shell.run(req)
    return attrs.evolve(out, stdout=out.stdout + out.stderr, stderr="")


async def _flags_full_output(shell: Any, req: CommandRequest) -> ExecResult:
    out = await shell.run(req)
    cap = req.max_output_bytes
    return attrs.evolve(
        out,
        stdout_truncated=out.stdout_truncated or len(out.stdout.encode()) >= cap,
        stderr_truncated=out.stderr_truncated or len(out.stderr.encode()) >= cap,
    )


async def _stdin_cut_at_64k(shell: Any, req: CommandRequest) -> ExecResult:
    stdin = None if req.stdin is None else req.stdin[: 64 * 1024]
    return await shell.run(attrs.evolve(req, stdin=stdin))  # type: ignore[no-any-return]


async def _relative_cwd_ignored(shell: Any, req: CommandRequest) -> ExecResult:
    cwd = req.cwd if req.cwd is None or req.cwd.startswith("/") else None
    return await shell.run(attrs.evolve(req, cwd=cwd))  # type: ignore[no-any-return]


async def _cwd_clamped(shell: Any, req: CommandRequest) -> ExecResult:
    cwd = None if req.cwd is None else _clamp(req.cwd)
    return await shell.run(attrs.evolve(req, cwd=cwd))  # type: ignore[no-any-return]


async def _env_values_stripped(shell: Any, req: CommandRequest) -> ExecResult:
    env = {k: v.strip() for k, v in req.env.items() if v.strip()}
    return await shell.run(attrs.evolve(req, env=env))  # type: ignore[no-any-return]


async def _forwards_host_env(shell: Any, req: CommandRequest) -> ExecResult:
    host = {k: v for k, v in os.environ.items() if k.startswith("CORRAL_")}
    return await shell.run(attrs.evolve(req, env={**host, **req.env}))  # type: ignore[no-any-return]


async def _timeout_is_124(shell: Any, req: CommandRequest) -> ExecResult:
    out = await shell.run(req)
    return attrs.evolve(out, exit_code=124) if out.timed_out else out


async def _first_word_allowlist(shell: Any, req: CommandRequest) -> ExecResult:
    allowed = req.allowed_commands
    if allowed is not None and req.command.split()[0] not in allowed:
        raise OperationError("not allowed", code="policy_denied")
    return await shell.run(attrs.evolve(req, allowed_commands=None))  # type: ignore[no-any-return]


async def _always_sh(shell: Any, req: CommandRequest) -> ExecResult:
    return await shell.run(attrs.evolve(req, allow_shell_syntax=True))  # type: ignore[no-any-return]


async def _duration_in_seconds(shell: Any, req: CommandRequest) -> ExecResult:
    out = await shell.run(req)
    return attrs.evolve(out, duration_ms=out.duration_ms / 1000)


_SHELL_CASES: list[tuple[ShellFix, tuple[str, ...]]] = [
    (_nonzero_is_one, ("shell_exit_codes", "shell_missing_and_non_executable_programs")),
    (_signal_as_status, ("shell_death_by_signal", "shell_timeout_kills_process_tree")),
    (_missing_raises, ("shell_missing_and_non_executable_programs",)),
    (_cannot_exec_is_127, ("shell_missing_and_non_executable_programs",)),
    (
        _merges_stderr,
        (
            "shell_output_cap_boundaries",
            "shell_output_is_capped",
            "shell_separates_stdout_and_stderr",
        ),
    ),
    (_flags_full_output, ("shell_output_cap_boundaries",)),
    (_stdin_cut_at_64k, ("shell_stdin_exact",)),
    (_relative_cwd_ignored, ("shell_cwd", "shell_cwd_outside_workspace_rejected")),
    (_cwd_clamped, ("shell_cwd_outside_workspace_rejected",)),
    (_env_values_stripped, ("shell_env_exact_and_host_env_absent",)),
    (_forwards_host_env, ("shell_env_exact_and_host_env_absent",)),
    (_timeout_is_124, ("shell_timeout_kills_process_tree",)),
    (_first_word_allowlist, ("shell_enforces_allowed_commands",)),
    (_always_sh, ("shell_refuses_syntax_when_not_allowed",)),
    (_duration_in_seconds, ("shell_duration",)),
]


@pytest.mark.parametrize(
    ("fix", "intended"), _SHELL_CASES, ids=lambda v: getattr(v, "__name__", "")
)
def test_shell_defect_fails_its_rule(
    tmp_path: Path, fix: ShellFix, intended: tuple[str, ...]
) -> None:
    pytest.importorskip("corral_local_bash", reason="corral-local-bash is not installed")
    _fails_only(lambda: _BrokenShellProvider(tmp_path, fix), SHELL_RULES, *intended)


def test_unbroken_bases_pass_every_module_rule(tmp_path: Path) -> None:
    """The bases pass, so each failure above is the defect's doing."""
    for factory, area in (
        (ReferenceProvider, FS_RULES + SNAPSHOT_RULES),
        (lambda: _BrokenShellProvider(tmp_path, lambda s, r: s.run(r)), SHELL_RULES),
    ):
        report = check_provider(factory, rules=area, max_examples=BUDGET, shrink=False)
        assert report.ok, report.format_table()
