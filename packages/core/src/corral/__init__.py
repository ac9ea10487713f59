"""corral: workspaces for AI agents.

Files, shell, code execution and snapshots, exposed as LLM tools and backed
by interchangeable providers discovered through the ``corral`` entry-point
group. Start with :func:`open_workspace`.
"""

from __future__ import annotations

from ._bridges import ToolCaller, anthropic_tool_results, openai_tool_messages
from ._capabilities import RESERVED_PREFIXES, Capability, check_user_tool_name
from ._data import (
    CommandRequest,
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
    WorkspaceConfig,
    WorkspaceRef,
)
from ._errors import (
    ConfigError,
    ErrorCode,
    OperationError,
    WorkspaceError,
    WorkspaceEvictedError,
    WorkspaceFailedError,
)
from ._observe import NoopMetrics, UsageRecorder, WorkspaceEvent, WorkspaceMetrics
from ._paths import (
    BINARY_SNIFF_BYTES,
    apply_edit,
    glob_match,
    is_binary,
    join_path,
    normalize_path,
    path_parts,
)
from ._plugins import BLOCK_ENV, CliCommand, PluginSet, ProviderSpec, load_plugins
from ._policies import CodePolicy, FsPolicy, ScriptPolicy, ShellPolicy, SnapshotPolicy
from ._protocols import (
    CodeInterpreter,
    FileSystem,
    OpenedWorkspace,
    Shell,
    Snapshotter,
    Workspace,
    WorkspaceProvider,
    describe_workspace,
)
from ._refs import (
    check_ref,
    check_ref_schema_version,
    ref_from_dict,
    ref_from_json,
    ref_to_dict,
    ref_to_json,
    structure_payload,
    unstructure_payload,
)
from ._regex import (
    LineSearch,
    Matcher,
    Re2Engine,
    RegexEngine,
    RegexModuleEngine,
    bytes_searcher,
    get_regex_engine,
    looks_catastrophic,
)
from ._registry import RegistrySnapshot, RegistryState, ScopedWorkspace, WorkspaceRegistry
from ._schema import Arg, ArgsSchema, WorkspacePath, args_schema
from ._session import WorkspaceSession, default_plugins, default_provider_kind, open_workspace
from ._store import RefStore, StoredSession
from ._tool import SessionControl, Tool, ToolEnv, ToolHandler, ToolRenderer, ToolResult, ToolSpec
from ._toolset import ResultFilter, WorkspaceToolset
from ._workspace import ModularWorkspace, ensure_open
from .hookspecs import hookimpl, hookspec

__all__ = [
    "BINARY_SNIFF_BYTES",
    "BLOCK_ENV",
    "RESERVED_PREFIXES",
    "Arg",
    "ArgsSchema",
    "Capability",
    "CliCommand",
    "CodeInterpreter",
    "CodePolicy",
    "CommandRequest",
    "ConfigError",
    "ErrorCode",
    "ExecResult",
    "FileEntry",
    "FileStat",
    "FileSystem",
    "FileType",
    "FsPolicy",
    "GrepMatch",
    "GrepOptions",
    "GrepResult",
    "LineSearch",
    "Matcher",
    "ModularWorkspace",
    "NoopMetrics",
    "OpenedWorkspace",
    "OperationError",
    "PluginSet",
    "ProviderConfig",
    "ProviderSpec",
    "Re2Engine",
    "RefStore",
    "RegexEngine",
    "RegexModuleEngine",
    "RegistrySnapshot",
    "RegistryState",
    "ResultFilter",
    "ScopedWorkspace",
    "ScriptPolicy",
    "SessionControl",
    "SessionRef",
    "Shell",
    "ShellPolicy",
    "SnapshotInfo",
    "SnapshotPolicy",
    "Snapshotter",
    "StoredSession",
    "Tool",
    "ToolCaller",
    "ToolEnv",
    "ToolHandler",
    "ToolRenderer",
    "ToolResult",
    "ToolSpec",
    "UsageRecorder",
    "Workspace",
    "WorkspaceConfig",
    "WorkspaceError",
    "WorkspaceEvent",
    "WorkspaceEvictedError",
    "WorkspaceFailedError",
    "WorkspaceMetrics",
    "WorkspacePath",
    "WorkspaceProvider",
    "WorkspaceRef",
    "WorkspaceRegistry",
    "WorkspaceSession",
    "WorkspaceToolset",
    "anthropic_tool_results",
    "apply_edit",
    "args_schema",
    "bytes_searcher",
    "check_ref",
    "check_ref_schema_version",
    "check_user_tool_name",
    "default_plugins",
    "default_provider_kind",
    "describe_workspace",
    "ensure_open",
    "get_regex_engine",
    "glob_match",
    "hookimpl",
    "hookspec",
    "is_binary",
    "join_path",
    "load_plugins",
    "looks_catastrophic",
    "normalize_path",
    "open_workspace",
    "openai_tool_messages",
    "path_parts",
    "ref_from_dict",
    "ref_from_json",
    "ref_to_dict",
    "ref_to_json",
    "structure_payload",
    "unstructure_payload",
]
