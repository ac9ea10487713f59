"""Every public namespace, pinned: a name added or removed must be a decision.

corral has one namespace per audience (trio's ``test_exports`` habit): an
agent builder reads ``corral``, a provider author ``corral.provider``, a
capability author ``corral.capability``, a test writer ``corral.testing``.
Adding a name to one of them here is the moment to ask who needs it.
"""

from __future__ import annotations

import importlib
import inspect
import types

import pytest

EXPECTED: dict[str, frozenset[str]] = {
    "corral": frozenset(
        {
            "AnthropicTool",
            "AnthropicToolResultBlock",
            "AnthropicToolResultMessage",
            "AsyncCall",
            "CapabilityEvent",
            "CodePolicy",
            "CommandStream",
            "ConfigError",
            "ErrorCode",
            "Event",
            "EventSink",
            "EventsDropped",
            "EvictionRetried",
            "ExecError",
            "ExecResult",
            "CodeContextInfo",
            "CodeOutput",
            "CodeState",
            "ToolImage",
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
            "Progress",
            "ProcessPolicy",
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
        }
    ),
    "corral.provider": frozenset(
        {
            "DEFAULT_RETAINED_BYTES",
            "CursorExpiredError",
            "ProcessInfo",
            "ProcessManager",
            "ProcessRequest",
            "ProcessState",
            "StatelessScriptRunner",
            "StreamChunk",
            "StreamName",
            "TerminalSize",
            "echo_if_short",
            "lazy_exports",
            "BINARY_SNIFF_BYTES",
            "BuildContext",
            "CliCommand",
            "CodeInterpreter",
            "CodeContexts",
            "CodeContextInfo",
            "CodeOutput",
            "CodeState",
            "CommandRequest",
            "ConfigError",
            "DEFAULT_MAX_FILE_BYTES",
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
            "glob_match",
            "hookimpl",
            "is_binary",
            "join_path",
            "normalize_path",
            "path_parts",
            "positive_size_option",
            "structure_payload",
            "unstructure_payload",
            "workspace_closed",
        }
    ),
    "corral.capability": frozenset(
        {
            "echo_if_short",
            "lazy_exports",
            "Arg",
            "ArgsSchema",
            "Capability",
            "CliCommand",
            "ConfigError",
            "ErrorCode",
            "GrepOptions",
            "Matcher",
            "OperationError",
            "RegexEngine",
            "SessionControl",
            "ToolContent",
            "ToolImage",
            "ToolEnv",
            "ToolHandler",
            "ToolHints",
            "ToolRenderer",
            "ToolResult",
            "ToolSpec",
            "WorkspacePath",
            "args_schema",
            "get_regex_engine",
            "hookimpl",
        }
    ),
    "corral.testing": frozenset(
        {
            "LinesOnlyMatcher",
            "RecordingObserver",
            "RecordingUsage",
            "noop_logger",
            "tool_env",
            "workspace_context",
        }
    ),
    "corral.sync": frozenset(
        {
            "Blocking",
            "BlockingWorkspace",
            "SyncWorkspaceSession",
            "open_workspace",
        }
    ),
}

SUBMODULES = {"capability", "hookspecs", "provider", "sync", "testing"}


def _module(name: str) -> types.ModuleType:
    return importlib.import_module(name)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_namespace_exports_exactly_its_pinned_names(name: str) -> None:
    module = _module(name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), "a name is listed twice in __all__"
    assert set(exported) - EXPECTED[name] == set(), "added: say who needs it, then pin it"
    assert EXPECTED[name] - set(exported) == set(), "removed: a clean break, pinned here"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_exported_name_exists_is_documented_and_comes_from_corral(name: str) -> None:
    module = _module(name)
    assert module.__doc__
    for attr in module.__all__:
        obj = getattr(module, attr)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__, f"{name}.{attr} has no docstring"
            assert obj.__module__.startswith("corral"), f"{name}.{attr}"


@pytest.mark.parametrize("name", ["corral", "corral.capability", "corral.provider"])
def test_nothing_public_hides_outside_all(name: str) -> None:
    # The audience namespaces only re-export; their every public name is a decision.
    module = _module(name)
    public = {n for n in vars(module) if not n.startswith("_")}
    imported_modules = {n for n in public if isinstance(getattr(module, n), types.ModuleType)}
    assert public - set(module.__all__) - imported_modules - {"annotations"} == set()
    assert not hasattr(module, "__getattr__"), "no lazy fallbacks: moved names break cleanly"


def test_a_name_in_several_namespaces_is_the_same_object() -> None:
    seen: dict[str, object] = {}
    for name in EXPECTED:
        module = _module(name)
        for attr in module.__all__:
            obj = getattr(module, attr)
            if attr in seen and name != "corral.sync":
                assert seen[attr] is obj, f"{name}.{attr} differs from another namespace's"
            seen.setdefault(attr, obj)


def test_the_builder_namespace_holds_no_provider_or_capability_plumbing() -> None:
    import corral

    for plumbing in (
        "ModularWorkspace",
        "WorkspaceAssembly",
        "apply_edit",
        "bytes_searcher",
        "Capability",
        "ToolSpec",
        "check_ref",
        "hookspec",
        "LineSearch",
    ):
        assert not hasattr(corral, plumbing), plumbing
