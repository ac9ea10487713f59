"""corral: workspaces for AI agents, handed to a model as tools.

Three words carry the whole library:

- A **workspace** is one agent session's box -- its files, its shell, its
  code interpreter, its snapshots -- that can be closed, releasing it and
  its data.
- A **provider** makes and finds workspaces of one kind: ``in-memory``
  (this process), ``local-bash`` (a host directory, no isolation),
  ``local-sandbox`` (bubblewrap), ``docker`` (a hardened container), or a
  third party's. You pick one by name; its ref (:class:`WorkspaceRef`) lets
  the same workspace be found again, in this process or another.
- A **capability** is what the agent may do, declared in the config
  (``{"fs": True, "shell": {"allowed_commands": ["ls"]}}``): a name, a
  policy (:class:`FsPolicy`, :class:`ShellPolicy`, ...) and the **tools**
  it gives the model. A tool (:class:`Tool`) is a name, a description, the
  JSON Schema of its arguments and a handler; calling it returns a
  :class:`ToolResult`, never a traceback. Exporters turn the same tools into
  OpenAI or Anthropic function specs.

Start with :func:`open_workspace`::

    async with corral.open_workspace("in-memory", {"fs": True}) as ws:
        result = await ws.call("workspace_write_file", {"path": "/a.txt", "content": "hi"})

This namespace is for whoever builds an agent: opening a workspace, config
and policy types, results and errors, exporters, observation, the plugin
loader and ``hookimpl``. Writing a provider: :mod:`corral.provider`.
Writing a capability: :mod:`corral.capability`. Testing code that uses
corral: :mod:`corral.testing`. No event loop: :mod:`corral.sync`.
"""

from __future__ import annotations

import logging as _logging

from ._bridges import (
    AnthropicTool,
    AnthropicToolResultBlock,
    AnthropicToolResultMessage,
    OpenAIAssistantMessage,
    OpenAIFunction,
    OpenAIResponsesFunctionCallOutput,
    OpenAIResponsesTool,
    OpenAITool,
    OpenAIToolMessage,
    ToolCaller,
    anthropic_tool,
    anthropic_tool_results,
    openai_assistant_message,
    openai_responses_tool,
    openai_responses_tool_outputs,
    openai_tool,
    openai_tool_messages,
)
from ._data import (
    CodeContextInfo,
    CodeOutput,
    CodeState,
    ExecError,
    ExecResult,
    FileEntry,
    FileStat,
    FileType,
    GrepMatch,
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
from ._observe import (
    CapabilityEvent,
    Event,
    EventsDropped,
    EventSink,
    EvictionRetried,
    MetricsSink,
    OpenRetrying,
    StateChanged,
    ToolCallFinished,
    UsageRecorder,
    UsageSink,
    WorkspaceClosed,
    WorkspaceEvicted,
    WorkspaceMetrics,
    WorkspaceOpened,
    WorkspaceOpenFailed,
)
from ._plugins import PluginSet, load_plugins
from ._policies import (
    CodePolicy,
    FsPolicy,
    ProcessPolicy,
    ScriptPolicy,
    ShellPolicy,
    SnapshotPolicy,
)
from ._progress import Progress, ProgressCallback, reporting_progress
from ._progress_bar import ProgressBar
from ._protocols import VersionChange
from ._refs import ref_from_dict, ref_from_json, ref_to_dict, ref_to_json
from ._regex import Re2Engine, RegexEngine, RegexModuleEngine, get_regex_engine
from ._registry import RegistrySnapshot, RegistryState, ScopedWorkspace, WorkspaceRegistry
from ._session import (
    ToolCallError,
    WorkspaceSession,
    default_plugins,
    default_provider_kind,
    open_workspace,
)
from ._store import RefStore, StoredSession
from ._streaming import CommandStream, OutputCallback, OutputChunk
from ._tool import Tool, ToolImage, ToolResult
from ._tool_source import AsyncCall, ToolSource, bound_tools
from ._toolset import ResultFilter, WorkspaceToolset
from .hookspecs import hookimpl

__all__ = [
    "AnthropicTool",
    "AnthropicToolResultBlock",
    "AnthropicToolResultMessage",
    "AsyncCall",
    "CapabilityEvent",
    "CodeContextInfo",
    "CodeOutput",
    "CodePolicy",
    "CodeState",
    "CommandStream",
    "ConfigError",
    "ErrorCode",
    "Event",
    "EventSink",
    "EventsDropped",
    "EvictionRetried",
    "ExecError",
    "ExecResult",
    "FileEntry",
    "FileStat",
    "FileType",
    "FsPolicy",
    "GrepMatch",
    "GrepResult",
    "MetricsSink",
    "OpenAIAssistantMessage",
    "OpenAIFunction",
    "OpenAIResponsesFunctionCallOutput",
    "OpenAIResponsesTool",
    "OpenAITool",
    "OpenAIToolMessage",
    "OpenRetrying",
    "OperationError",
    "OutputCallback",
    "OutputChunk",
    "PluginSet",
    "ProcessPolicy",
    "Progress",
    "ProgressBar",
    "ProgressCallback",
    "ProviderConfig",
    "Re2Engine",
    "RefStore",
    "RegexEngine",
    "RegexModuleEngine",
    "RegistrySnapshot",
    "RegistryState",
    "ResultFilter",
    "ScopedWorkspace",
    "ScriptPolicy",
    "SessionRef",
    "ShellPolicy",
    "SnapshotInfo",
    "SnapshotPolicy",
    "StateChanged",
    "StoredSession",
    "Tool",
    "ToolCallError",
    "ToolCallFinished",
    "ToolCaller",
    "ToolImage",
    "ToolResult",
    "ToolSource",
    "UsageRecorder",
    "UsageSink",
    "VersionChange",
    "WorkspaceClosed",
    "WorkspaceConfig",
    "WorkspaceError",
    "WorkspaceEvicted",
    "WorkspaceEvictedError",
    "WorkspaceFailedError",
    "WorkspaceMetrics",
    "WorkspaceOpenFailed",
    "WorkspaceOpened",
    "WorkspaceRef",
    "WorkspaceRegistry",
    "WorkspaceSession",
    "WorkspaceToolset",
    "anthropic_tool",
    "anthropic_tool_results",
    "bound_tools",
    "default_plugins",
    "default_provider_kind",
    "get_regex_engine",
    "hookimpl",
    "load_plugins",
    "open_workspace",
    "openai_assistant_message",
    "openai_responses_tool",
    "openai_responses_tool_outputs",
    "openai_tool",
    "openai_tool_messages",
    "ref_from_dict",
    "ref_from_json",
    "ref_to_dict",
    "ref_to_json",
    "reporting_progress",
]


# A library never prints on its own: without the application's logging config,
# records under "corral" (every corral package logs there) go nowhere instead of
# reaching logging's last-resort stderr handler.
_logging.getLogger("corral").addHandler(_logging.NullHandler())
