"""corral for provider authors: what a new kind of workspace implements and builds on.

Read this if you are publishing a provider (a hosted sandbox, a VM pool, a
remote host) or decorating one's modules. An agent builder never needs it:
``import corral`` is their surface.

A provider implements :class:`WorkspaceProvider` (``open`` and
``resolve``) and registers a :class:`ProviderSpec` through the
``corral_register_providers`` hook. The usual way to write one is a
:class:`WorkspaceBuilder` -- the parts only the provider knows: create,
locate, build and destroy one workspace's storage and modules -- handed to a
:class:`WorkspaceAssembly`, which does everything else every provider does
the same way: kind and capability checks, ref stamping and checking, strict
payload parsing, release on failure and at close. Every provider in this
repository is built like that.

The modules a workspace populates implement the protocols here
(:class:`FileSystem`, :class:`Shell`, :class:`CodeInterpreter`,
:class:`Snapshotter`, :class:`Versions`) and return the data classes
here. The helpers are the pieces every implementation needs to agree on:
workspace path normalisation and globbing, binary sniffing, the
``edit_file`` rule (:func:`apply_edit`), the grep fast path
(:class:`Matcher`, :func:`bytes_searcher`), progress reporting for long
operations, and the one default file-size cap. Decorators of a module
subclass :class:`ForwardingFileSystem` / :class:`ForwardingShell`; a
``script`` module subclasses :class:`StatelessScriptRunner` (one set of checks).

Prove a provider with ``corral conformance KIND`` (corral-conformance).
Names that an agent builder also uses (refs, errors, results) are the very
same objects as in ``corral``.
"""

from __future__ import annotations

from ._assembly import (
    BuildContext,
    Modules,
    WorkspaceAssembly,
    WorkspaceBuilder,
    WorkspacePayload,
    positive_size_option,
)
from ._data import (
    CodeContextInfo,
    CodeOutput,
    CodeState,
    CommandRequest,
    ExecError,
    ExecResult,
    FileEntry,
    FileStat,
    FileType,
    GrepMatch,
    GrepOptions,
    GrepResult,
    ProviderConfig,
    SessionRef,
    SnapshotInfo,
    WorkspaceRef,
)
from ._defaults import DEFAULT_MAX_FILE_BYTES
from ._echo import echo_if_short
from ._edit import apply_edit
from ._errors import (
    ConfigError,
    ErrorCode,
    OperationError,
    WorkspaceEvictedError,
    WorkspaceFailedError,
)
from ._forwarding import ForwardingFileSystem, ForwardingShell
from ._lazy import lazy_exports
from ._paths import (
    BINARY_SNIFF_BYTES,
    glob_match,
    is_binary,
    join_path,
    normalize_path,
    path_parts,
)
from ._plugins import CliCommand, ProviderSpec
from ._process import (
    DEFAULT_RETAINED_BYTES,
    CursorExpiredError,
    ProcessInfo,
    ProcessManager,
    ProcessRequest,
    ProcessState,
    StreamChunk,
    StreamName,
    TerminalSize,
)
from ._progress import Progress, ProgressCallback, ProgressReporter, current_progress_callback
from ._protocols import (
    CodeContexts,
    CodeInterpreter,
    FileSystem,
    OpenedWorkspace,
    SessionReclaimer,
    Shell,
    Snapshotter,
    VersionChange,
    Versions,
    Workspace,
    WorkspaceProvider,
    describe_workspace,
)
from ._refs import check_ref, check_ref_schema_version, structure_payload, unstructure_payload
from ._regex import Matcher, bytes_searcher
from ._script_runner import StatelessScriptRunner
from ._workspace import ModularWorkspace, workspace_closed
from .hookspecs import hookimpl

__all__ = [
    "BINARY_SNIFF_BYTES",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_RETAINED_BYTES",
    "BuildContext",
    "CliCommand",
    "CodeContextInfo",
    "CodeContexts",
    "CodeInterpreter",
    "CodeOutput",
    "CodeState",
    "CommandRequest",
    "ConfigError",
    "CursorExpiredError",
    "ErrorCode",
    "ExecError",
    "ExecResult",
    "FileEntry",
    "FileStat",
    "FileSystem",
    "FileType",
    "ForwardingFileSystem",
    "ForwardingShell",
    "GrepMatch",
    "GrepOptions",
    "GrepResult",
    "Matcher",
    "ModularWorkspace",
    "Modules",
    "OpenedWorkspace",
    "OperationError",
    "ProcessInfo",
    "ProcessManager",
    "ProcessRequest",
    "ProcessState",
    "Progress",
    "ProgressCallback",
    "ProgressReporter",
    "ProviderConfig",
    "ProviderSpec",
    "SessionReclaimer",
    "SessionRef",
    "Shell",
    "SnapshotInfo",
    "Snapshotter",
    "StatelessScriptRunner",
    "StreamChunk",
    "StreamName",
    "TerminalSize",
    "VersionChange",
    "Versions",
    "Workspace",
    "WorkspaceAssembly",
    "WorkspaceBuilder",
    "WorkspaceEvictedError",
    "WorkspaceFailedError",
    "WorkspacePayload",
    "WorkspaceProvider",
    "WorkspaceRef",
    "apply_edit",
    "bytes_searcher",
    "check_ref",
    "check_ref_schema_version",
    "current_progress_callback",
    "describe_workspace",
    "echo_if_short",
    "glob_match",
    "hookimpl",
    "is_binary",
    "join_path",
    "lazy_exports",
    "normalize_path",
    "path_parts",
    "positive_size_option",
    "structure_payload",
    "unstructure_payload",
    "workspace_closed",
]
