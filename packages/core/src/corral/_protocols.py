"""The provider contract: workspace modules, workspaces and providers.

Semantics every implementation follows (the conformance suite checks them):

Paths are the agent's view of the workspace: ``/a/b.txt`` and ``a/b.txt``
name the same file; ``..`` that would climb above the root is an
``OperationError(code="invalid_path")``, as are NUL bytes, empty components
from malformed input and over-long paths (see :func:`corral.provider.normalize_path`).
Every name of 1 to 255 UTF-8 bytes without ``/`` or NUL (other than ``.`` and
``..``) is legal; names are case-sensitive and kept exactly as given (no
Unicode normalisation), and file contents are arbitrary bytes.

A workspace whose commands see its root at an absolute path (``/workspace``
in a sandbox or container, the host directory without a boundary) says so in
``details()["workspace_path"]``; the tool layer shows the model every path
under it, so file tools and commands share one namespace (``corral._mount``).
Modules themselves keep taking and returning the ``/``-rooted view.

FileSystem:

* ``read_file``: missing -> ``not_found``; a directory -> ``is_a_directory``;
  not a regular file -> ``unsupported_file_type``; larger than ``max_bytes``
  (when given) -> ``too_large``, decided before the content is read (a file
  of exactly ``max_bytes`` is read whole).
* ``write_file``: creates missing parent directories; a directory at the
  path -> ``is_a_directory``; a file where a parent should be ->
  ``not_a_directory``. Atomic: readers see the old or the new content.
* ``edit_file``: replaces ``old_text`` with ``new_text`` in a UTF-8 file;
  absent -> ``no_match``; several and not ``replace_all`` -> ``not_unique``;
  empty ``old_text`` -> ``invalid_argument``; a file that is not UTF-8 ->
  ``unsupported_file_type``. Returns the count replaced.
* ``ls``: entries of a directory sorted by name; a file -> ``not_a_directory``.
* ``glob``: files and directories under ``path`` whose path relative to it
  matches the pattern (``*``, ``?``, ``[...]`` within one component, ``**``
  any number of components); sorted agent-view paths.
* ``grep``: regular files under ``options.path`` (or that file), filtered by
  ``options.glob`` (matched against the basename, or the relative path when
  the glob holds a ``/``); files with a NUL byte in their first 8 KiB are
  reported in ``skipped_binary_paths``, unreadable or over-size files in
  ``skipped_paths``; matches sorted by path then line; ``truncated`` exactly
  when more matching lines exist than ``max_results`` (not when exactly
  that many do); ``max_results`` below 1 -> ``invalid_argument``.
* ``stat``: a leaf symlink is reported as ``symlink`` and not followed.
* ``mkdir``: ``parents=False`` and a missing parent -> ``not_found``; the
  path exists -> ``exists`` unless ``parents=True`` and it is a directory.
* ``rm``: missing -> ``not_found``; a non-empty directory without
  ``recursive`` -> ``not_empty``; the root -> ``invalid_argument``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from ._data import (
    CodeContextInfo,
    CommandRequest,
    ExecResult,
    FileEntry,
    FileStat,
    FileType,
    GrepOptions,
    GrepResult,
    ProviderConfig,
    SessionRef,
    SnapshotInfo,
    WorkspaceRef,
)
from ._regex import Matcher

__all__ = [
    "CodeContexts",
    "CodeInterpreter",
    "FileSystem",
    "OpenedWorkspace",
    "SessionReclaimer",
    "Shell",
    "Snapshotter",
    "VersionChange",
    "Versions",
    "Workspace",
    "WorkspaceProvider",
]


@runtime_checkable
class FileSystem(Protocol):
    """Files of one workspace, addressed by agent-view paths."""

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Return the whole content of a regular file (at most ``max_bytes``)."""
        ...

    async def write_file(self, path: str, data: bytes) -> None:
        """Atomically create or replace a file, creating parent directories."""
        ...

    async def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        """Replace text in a UTF-8 file atomically; return how many replacements."""
        ...

    async def ls(self, path: str = "/") -> Sequence[FileEntry]:
        """List a directory, sorted by name."""
        ...

    async def glob(self, pattern: str, path: str = "/") -> Sequence[str]:
        """Return sorted paths under ``path`` matching ``pattern``."""
        ...

    async def grep(self, matcher: Matcher, options: GrepOptions) -> GrepResult:
        """Search file contents line by line with a compiled matcher."""
        ...

    async def stat(self, path: str) -> FileStat:
        """Describe a path without following a leaf symlink."""
        ...

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        """Create a directory."""
        ...

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file or directory."""
        ...


@runtime_checkable
class Shell(Protocol):
    """Runs commands in the workspace."""

    async def run(self, request: CommandRequest) -> ExecResult:
        """Run one command, enforcing every limit in ``request``.

        A command the policy refuses raises ``OperationError(code="policy_denied")``
        before anything runs: the shell enforces the policy itself, not only the
        tool layer -- a program not in ``allowed_commands`` (with shell syntax,
        the program of any command in the line, after ``|``, ``&&``, ``||``,
        ``;`` or a newline), or shell syntax while ``allow_shell_syntax`` is
        False. A program that does not exist exits 127, one that cannot be
        executed 126 (results, not exceptions). The command sees ``env``
        exactly, on top of the provider's base environment, never the
        variables of the process hosting the provider.
        A timeout is not an exception: the result has ``timed_out=True`` and the
        whole process tree has been killed.
        """
        ...


@runtime_checkable
class CodeInterpreter(Protocol):
    """Runs code snippets, optionally in stateful contexts.

    The contract every implementation keeps (``corral-conformance`` checks it):

    - ``languages`` are the languages this workspace really has (an
      interpreter found in the box, not a wish); asking for another one is an
      ``OperationError(code="invalid_argument")`` naming the available ones.
    - Errors of the code are results, not exceptions: ``ExecResult.error``
      carries name, value and traceback; ``exit_code`` is 0 without an error
      and 1 with one (a ``bash`` cell: the status of its last command, as a
      shell reports it, with a non-zero status as ``error``).
    - On timeout the interpreter is interrupted first (SIGINT in Python:
      ``KeyboardInterrupt``); if it honours that, the result has
      ``timed_out=True`` and ``state="kept"``. If it does not within a short
      grace, the interpreter is killed and the result says ``state="lost"``.
    - A context whose interpreter died (killed, out of memory, crashed, or
      left behind by a process that ended) is never silently replaced: every
      later call on it raises ``OperationError(code="lost")`` with the reason,
      until it is deleted (or restarted, see :class:`CodeContexts`).
    - One execution per context at a time: a second call waits, bounded,
      then raises ``OperationError(code="busy")``.
    - An unknown context id is ``OperationError(code="not_found")``.
    """

    @property
    def languages(self) -> frozenset[str]:
        """Languages this interpreter accepts."""
        ...

    async def run_code(self, language: str, code: str, *, timeout_s: float) -> ExecResult:
        """Run a snippet in a fresh interpreter (``state="fresh"``: nothing is kept)."""
        ...

    async def create_context(self, language: str) -> str:
        """Start a stateful context and return its id."""
        ...

    async def run_in_context(self, context_id: str, code: str, *, timeout_s: float) -> ExecResult:
        """Run a snippet in an existing context; its variables persist between runs."""
        ...

    async def delete_context(self, context_id: str) -> None:
        """Discard a context (a lost one too), killing its interpreter and all it started."""
        ...


@runtime_checkable
class CodeContexts(CodeInterpreter, Protocol):
    """A :class:`CodeInterpreter` whose contexts can also be listed, restarted and interrupted.

    The POSIX providers' ``code`` module is one; the tools need only
    :class:`CodeInterpreter`, library callers check for this with
    ``isinstance``.
    """

    async def create_context(self, language: str, *, cwd: str | None = None) -> str:
        """Start a context whose working directory is ``cwd`` (agent path; default the root).

        Raises:
            OperationError: ``invalid_argument`` for a language the workspace
                lacks (the message lists the available ones); ``not_found`` /
                ``not_a_directory`` / ``invalid_path`` for the cwd.
        """
        ...

    async def list_contexts(self) -> Sequence[CodeContextInfo]:
        """The contexts this workspace knows, oldest first, lost ones included."""
        ...

    async def restart_context(self, context_id: str) -> None:
        """Replace the context's interpreter with a new one (all state is dropped).

        The only way a lost context comes back, and an explicit one: the
        caller asked for the state to go.
        """
        ...

    async def interrupt_context(self, context_id: str) -> bool:
        """Interrupt the cell running in the context; False when none was running."""
        ...

    async def run_in_context(
        self,
        context_id: str,
        code: str,
        *,
        timeout_s: float,
        on_output: Callable[[str, str], object] | None = None,
    ) -> ExecResult:
        """Run a cell; ``on_output(stream, text)`` sees stdout/stderr as it arrives.

        The result still holds all of it (capped): the callback is for a
        caller that shows progress, not a second channel.
        """
        ...


@runtime_checkable
class Snapshotter(Protocol):
    """Point-in-time copies of a workspace."""

    async def snapshot(self, label: str | None = None) -> SnapshotInfo:
        """Store the current state and describe the snapshot."""
        ...

    async def restore(self, snapshot_id: str) -> WorkspaceRef:
        """Bring back exactly the snapshot's state; return the workspace's (new) ref."""
        ...

    async def list(self) -> Sequence[SnapshotInfo]:
        """Snapshots of this workspace, oldest first (the order they were taken).

        Each is described as ``snapshot`` described it (id, label exactly as
        given, ``created_at``); ``restore`` leaves the list unchanged.
        """
        ...

    async def delete(self, snapshot_id: str) -> None:
        """Remove a snapshot; an unknown id -> ``OperationError(code="not_found")``.

        Unknown includes an id already deleted and another workspace's id.
        """
        ...

    async def branch(self, snapshot_id: str) -> WorkspaceRef:
        """Create a separate workspace seeded from a snapshot and return its ref."""
        ...


@attrs.frozen
class VersionChange:
    """One entry that differs between two versions of a workspace (see :meth:`Versions.diff`).

    Attributes:
        path: Agent-view path.
        change: ``added``, ``removed`` or ``modified`` (same path, different
            type, content, symlink target or permission mode).
        type: The entry's type in the newer state (in the older one for ``removed``).
        old_size: File size before (``None`` when added; 0 for non-files).
        new_size: File size after (``None`` when removed; 0 for non-files).
    """

    path: str
    change: Literal["added", "removed", "modified"]
    type: FileType
    old_size: int | None = None
    new_size: int | None = None


@runtime_checkable
class Versions(Snapshotter, Protocol):
    """A :class:`Snapshotter` whose snapshots can be read and compared without restoring them.

    Snapshots are *versions*: immutable once taken. Everything here reads the
    stored version only; nothing starts, restores or changes the live
    workspace, and (for providers that keep versions outside the box) it
    works while no command runs in the workspace.

    * ``read_file_at``, ``ls_at``, ``stat_at`` and ``grep_at`` answer exactly
      as the workspace's :class:`FileSystem` would have answered at the
      moment of the snapshot (same errors: ``not_found``, ``is_a_directory``,
      ``not_a_directory``, ``too_large``; a leaf symlink is stat-ed as a
      symlink and never followed, and reading one is ``invalid_path``). The
      ``mtime`` of ``stat_at`` is the snapshot's ``created_at``.
    * ``diff(a, b)`` lists the entries that differ from version ``a`` to
      version ``b`` (``b=None``: to the live workspace now), sorted by path,
      one :class:`VersionChange` per entry (what lies under an added or
      removed directory is listed entry by entry).
    * An unknown id is ``not_found``. Content that fails verification (a
      damaged or missing stored blob) is ``OperationError(code="failed")``
      whose message names the version and the path; such content is never
      returned or restored.
    """

    async def read_file_at(
        self, snapshot_id: str, path: str, *, max_bytes: int | None = None
    ) -> bytes:
        """A file's content as it was in a version."""
        ...

    async def ls_at(self, snapshot_id: str, path: str = "/") -> Sequence[FileEntry]:
        """A directory's listing as it was in a version, sorted by name."""
        ...

    async def stat_at(self, snapshot_id: str, path: str) -> FileStat:
        """A path's metadata as it was in a version (a leaf symlink is not followed)."""
        ...

    async def grep_at(self, snapshot_id: str, matcher: Matcher, options: GrepOptions) -> GrepResult:
        """Search a version's files as :meth:`FileSystem.grep` searches the live ones."""
        ...

    async def diff(self, a: str, b: str | None = None) -> Sequence[VersionChange]:
        """What changed from version ``a`` to version ``b`` (or to the live workspace)."""
        ...


@runtime_checkable
class Workspace(Protocol):
    """A live workspace: an id, the modules the provider populated, and ``close``."""

    @property
    def id(self) -> str:
        """Stable identifier, unique per provider."""
        ...

    @property
    def fs(self) -> FileSystem | None:
        """The file system module, if populated."""
        ...

    @property
    def shell(self) -> Shell | None:
        """The shell module, if populated."""
        ...

    @property
    def code(self) -> CodeInterpreter | None:
        """The code interpreter module, if populated."""
        ...

    @property
    def script(self) -> CodeInterpreter | None:
        """The ephemeral script runner, if populated."""
        ...

    @property
    def snapshot(self) -> Snapshotter | None:
        """The snapshot module, if populated."""
        ...

    def module(self, name: str) -> object | None:
        """Any module by name, including third-party ones; None if absent."""
        ...

    async def close(self) -> None:
        """Release the workspace and its data. Idempotent.

        Afterwards every method of every module raises
        ``OperationError(code="closed")``, no handle reads the data back, and
        ``resolve`` of the workspace's ref raises ``WorkspaceFailedError``.
        """
        ...


@attrs.frozen
class OpenedWorkspace:
    """What ``WorkspaceProvider.open`` returns: the live workspace and its ref."""

    workspace: Workspace
    ref: WorkspaceRef


@runtime_checkable
class WorkspaceProvider(Protocol):
    """Creates and re-attaches workspaces; holds no per-session state.

    One instance serves every session: nothing one session sets (files,
    environment, working directory, processes, snapshots) is observable from
    another, and a fresh instance (as after a restart) resolves the refs of
    another instance to the same workspace.
    """

    @property
    def provider_id(self) -> str:
        """The kind this provider answers to (``ProviderConfig.kind``)."""
        ...

    @property
    def capabilities(self) -> frozenset[str]:
        """Capabilities this provider can populate."""
        ...

    @property
    def schema_version(self) -> int:
        """Current version N of this provider's ref payload."""
        ...

    async def open(
        self,
        config: ProviderConfig,
        session: SessionRef,
        declared: frozenset[str] | None = None,
    ) -> OpenedWorkspace:
        """Create a workspace for a session.

        Raises:
            WorkspaceFailedError: The workspace cannot be created.
        """
        ...

    async def resolve(self, ref: WorkspaceRef) -> Workspace:
        """Re-attach a workspace from a persisted ref.

        The workspace comes back with the same ``id``, its data, and at least
        the modules ``ref.capabilities`` names. A ref is untrusted: a payload
        that does not name a live workspace of this provider is refused, never
        answered with a fresh empty workspace.

        Raises:
            WorkspaceFailedError: The ref is foreign, malformed, of an
                unsupported version, or its workspace is gone (never
                ``WorkspaceEvictedError``); the first three with
                ``transient=False``.
        """
        ...


@runtime_checkable
class SessionReclaimer(Protocol):
    """Optional provider hook: remove what an ``open`` for a session may have left.

    A ref names a workspace only once ``open`` returned it, and providers add
    randomness to names, so a caller killed between ``open`` and recording
    the ref cannot name the box it leaked. A service that records its intent
    ("opening for session S") first calls this on recovery, before opening
    again. Only the provider knows how it names what it creates, so the
    search lives here, never in the caller.
    """

    async def reclaim_session(self, session_id: str) -> int:
        """Remove every workspace this provider created for ``session_id``; return how many.

        The caller guarantees that no live handle of that session exists (it
        holds the session's exclusive lease), so everything found is a leak.
        Session ids a provider cannot tell apart are one session here
        (posix-core keeps 32 characters of ``[A-Za-z0-9_-]``): callers use
        unique, plain ids.
        """
        ...


def describe_workspace(ws: Workspace) -> Mapping[str, Any]:
    """Provider details a workspace chooses to expose (``details()``), or nothing."""
    details = getattr(ws, "details", None)
    if callable(details):
        result = details()
        if isinstance(result, Mapping):
            return dict(result)
    return {}
