"""The tool layer: names, validation before I/O, policies, eviction retry, usage, filters."""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest

import corral
from corral import SessionRef, ToolResult, WorkspaceRegistry, WorkspaceToolset
from corral._observe import EventStream
from corral.testing import RecordingObserver, RecordingUsage

pytestmark = pytest.mark.anyio

FS_TOOLS = {
    "workspace_read_file",
    "workspace_write_file",
    "workspace_edit_file",
    "workspace_ls",
    "workspace_glob",
    "workspace_grep",
    "workspace_stat",
    "workspace_mkdir",
    "workspace_rm",
}
SNAPSHOT_TOOLS = {
    "workspace_snapshot",
    "workspace_restore",
    "workspace_list_snapshots",
    "workspace_delete_snapshot",
    "workspace_branch",
    "workspace_changes_since_snapshot",
    "workspace_read_file_at_snapshot",
}


def toolset(
    provider: Any, plugins: corral.PluginSet, caps: dict[str, Any], **kw: Any
) -> WorkspaceToolset:
    config = corral.WorkspaceConfig(corral.ProviderConfig("fake"), caps)
    registry = WorkspaceRegistry(
        config, SessionRef("s"), provider, observers=kw.pop("observers", ())
    )
    return WorkspaceToolset(registry, plugins.capabilities, **kw)


async def test_tool_names_follow_the_spec(provider: Any, plugins: corral.PluginSet) -> None:
    ts = toolset(provider, plugins, {"fs": True, "shell": True, "snapshot": True})
    names = {t.name for t in ts.tools}
    assert names == FS_TOOLS | SNAPSHOT_TOOLS | {"workspace_run"}
    code = toolset(provider, plugins, {"code": {"is_stateful": True}})
    assert {t.name for t in code.tools} == {
        "workspace_run_code",
        "workspace_create_code_context",
        "workspace_run_in_code_context",
        "workspace_delete_code_context",
    }
    assert {t.name for t in toolset(provider, plugins, {"code": True}).tools} == {
        "workspace_run_code"
    }
    assert {t.name for t in toolset(provider, plugins, {"script": True}).tools} == {
        "workspace_script"
    }


async def test_undeclared_capability_has_no_tools(provider: Any, plugins: corral.PluginSet) -> None:
    ts = toolset(provider, plugins, {"fs": True, "shell": False})
    result = await ts.call("workspace_run", {"command": "ls"})
    assert result.is_error
    assert "unknown tool" in result.content


async def test_read_only_policy_offers_only_read_tools(
    provider: Any, plugins: corral.PluginSet
) -> None:
    ts = toolset(provider, plugins, {"fs": {"read_only": True}})
    assert {t.name for t in ts.tools} == {
        "workspace_read_file",
        "workspace_ls",
        "workspace_glob",
        "workspace_grep",
        "workspace_stat",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "missing required argument 'path'"),
        ({"path": 3}, "argument 'path': expected a string"),
        ({"path": "/a", "offset": 0}, "argument 'offset': must be at least 1"),
        ({"path": "/a", "offset": True}, "argument 'offset': expected an integer"),
        ({"path": "/a", "bogus": 1}, "unknown argument 'bogus'"),
        ("not an object", "arguments must be a JSON object"),
        ({"path": "/a\x00b"}, "NUL"),
        ({"path": "/../etc/passwd"}, "escapes the workspace root"),
    ],
)
async def test_bad_arguments_fail_before_any_io(
    provider: Any, plugins: corral.PluginSet, args: Any, message: str
) -> None:
    ts = toolset(provider, plugins, {"fs": True})
    result = await ts.call("workspace_read_file", args)
    assert result.is_error
    assert result.error_code in ("invalid_argument", "invalid_path")
    assert message in result.content
    assert provider.calls == []
    assert provider.opens == 0


async def test_write_read_edit_round_trip(provider: Any, plugins: corral.PluginSet) -> None:
    ts = toolset(provider, plugins, {"fs": True})
    assert not (
        await ts.call("workspace_write_file", {"path": "a.txt", "content": "one two two"})
    ).is_error
    read = await ts.call("workspace_read_file", {"path": "/a.txt"})
    assert read.content == "one two two"
    assert read.data["encoding"] == "utf-8"
    not_unique = await ts.call(
        "workspace_edit_file", {"path": "/a.txt", "old_text": "two", "new_text": "2"}
    )
    assert not_unique.is_error
    assert not_unique.error_code == "not_unique"
    done = await ts.call(
        "workspace_edit_file",
        {"path": "/a.txt", "old_text": "two", "new_text": "2", "replace_all": True},
    )
    assert done.data == {"path": "/a.txt", "replacements": 2}
    assert (await ts.call("workspace_read_file", {"path": "/a.txt"})).content == "one 2 2"


async def test_read_file_pages_and_reports_truncation(
    provider: Any, plugins: corral.PluginSet
) -> None:
    ts = toolset(provider, plugins, {"fs": True})
    text = "".join(f"line {i}\n" for i in range(1, 11))
    await ts.call("workspace_write_file", {"path": "/n.txt", "content": text})
    page = await ts.call("workspace_read_file", {"path": "/n.txt", "offset": 3, "limit": 2})
    assert page.data["content"] == "line 3\nline 4\n"
    assert page.data["truncated"] is True
    assert page.data["total_lines"] == 10
    assert "call again with offset=5" in page.content
    tail = await ts.call("workspace_read_file", {"path": "/n.txt", "offset": 9})
    assert tail.data["truncated"] is False


async def test_binary_content_round_trips_as_base64(
    provider: Any, plugins: corral.PluginSet
) -> None:
    ts = toolset(provider, plugins, {"fs": True})
    blob = bytes(range(256))
    encoded = base64.b64encode(blob).decode()
    wrote = await ts.call(
        "workspace_write_file", {"path": "/b.bin", "content": encoded, "encoding": "base64"}
    )
    assert wrote.data["bytes_written"] == 256
    read = await ts.call("workspace_read_file", {"path": "/b.bin"})
    assert read.data["encoding"] == "base64"
    assert base64.b64decode(read.data["content"]) == blob
    bad = await ts.call(
        "workspace_write_file", {"path": "/c", "content": "@@@", "encoding": "base64"}
    )
    assert bad.error_code == "invalid_argument"


async def test_fs_size_policy_is_enforced_at_the_tool_layer(
    provider: Any, plugins: corral.PluginSet
) -> None:
    ts = toolset(provider, plugins, {"fs": {"max_file_size_mb": 0.001}})
    big = "x" * 2000
    result = await ts.call("workspace_write_file", {"path": "/big", "content": big})
    assert result.error_code == "too_large"
    assert "write_file" not in provider.calls
    provider_fs_files = provider.stores.setdefault("ws-s-1", {})
    provider_fs_files["/big"] = big.encode()
    read = await ts.call("workspace_read_file", {"path": "/big"})
    assert read.error_code == "too_large"
    assert "over the 0.001 MB read limit" in read.content
    assert provider.calls.count("read_file") == 1
    assert "stat" not in provider.calls


async def test_operation_errors_become_clean_results(
    provider: Any, plugins: corral.PluginSet
) -> None:
    ts = toolset(provider, plugins, {"fs": True})
    result = await ts.call("workspace_read_file", {"path": "/missing"})
    assert result.is_error
    assert result.error_code == "not_found"
    assert "Traceback" not in result.content


async def test_unexpected_exception_is_contained(
    provider: Any, plugins: corral.PluginSet, caplog: pytest.LogCaptureFixture
) -> None:
    ts = toolset(provider, plugins, {"fs": True})
    await ts.call("workspace_ls", {})
    assert provider.last_fs is not None

    async def broken(path: str = "/") -> Any:
        raise ZeroDivisionError("secret internals")

    provider.last_fs.ls = broken
    with caplog.at_level(logging.ERROR):
        result = await ts.call("workspace_ls", {})
    assert result.is_error
    assert result.error_code == "internal"
    assert "secret internals" not in result.content
    assert "ZeroDivisionError" in caplog.text


async def test_eviction_is_retried_exactly_once(provider: Any, plugins: corral.PluginSet) -> None:
    seen = RecordingObserver()
    ts = toolset(provider, plugins, {"fs": True}, observers=[seen])
    await ts.call("workspace_write_file", {"path": "/a", "content": "x"})
    assert provider.last_fs is not None
    provider.last_fs.evict_next = 1
    result = await ts.call("workspace_read_file", {"path": "/a"})
    assert not result.is_error
    assert result.content == "x"
    assert provider.resolves == 1
    (retry,) = seen.of_type(corral.EvictionRetried)
    assert (retry.tool, retry.outcome) == ("workspace_read_file", "recovered")
    # The retry settles before the call does: one stream, in order.
    assert seen.names()[-2:] == ["EvictionRetried", "ToolCallFinished"]


async def test_eviction_retry_exhausted_is_logged_and_reported(
    provider: Any, plugins: corral.PluginSet, caplog: pytest.LogCaptureFixture
) -> None:
    ts = toolset(provider, plugins, {"fs": True})
    await ts.call("workspace_write_file", {"path": "/a", "content": "x"})
    original_build = provider._build

    def always_evicting(ws_id: str) -> Any:
        ws = original_build(ws_id)
        provider.last_fs.evict_next = 10**6
        return ws

    provider._build = always_evicting
    provider.last_fs.evict_next = 10**6
    with caplog.at_level(logging.ERROR):
        result = await ts.call("workspace_read_file", {"path": "/a"})
    assert result.is_error
    assert result.error_code == "workspace_evicted"
    assert "eviction retry exhausted" in caplog.text
    assert provider.resolves == 1


async def test_usage_is_recorded_per_call(provider: Any, plugins: corral.PluginSet) -> None:
    usage = RecordingUsage()
    ts = toolset(provider, plugins, {"fs": True}, observers=[corral.UsageSink(usage)])
    await ts.call("workspace_write_file", {"path": "/a", "content": "x"})
    await ts.call("workspace_read_file", {"path": "/nope"})
    assert [r[0] for r in usage.records] == ["workspace.write_file", "workspace.read_file"]
    assert all(r[2] == "s" and r[1] >= 0 for r in usage.records)


async def test_every_call_is_one_tool_call_event(provider: Any, plugins: corral.PluginSet) -> None:
    seen = RecordingObserver()
    ts = toolset(provider, plugins, {"fs": True}, observers=[seen], trace_context={"trace_id": "t"})
    await ts.call("workspace_write_file", {"path": "/a", "content": "x"})
    await ts.call("workspace_read_file", {"path": "/nope"})
    await ts.call("workspace_read_file", {"path": 3})
    calls = seen.of_type(corral.ToolCallFinished)
    assert [(c.tool, c.op, c.capability, c.status, c.error_code) for c in calls] == [
        ("workspace_write_file", "write_file", "fs", "ok", None),
        ("workspace_read_file", "read_file", "fs", "error", "not_found"),
        ("workspace_read_file", "read_file", "fs", "error", "invalid_argument"),
    ]
    assert all(c.session_id == "s" and c.provider_id == "fake" for c in calls)
    assert all(c.trace == {"trace_id": "t"} and c.duration_ms >= 0 for c in calls)


async def test_metrics_see_tool_calls_through_the_stream(
    provider: Any, plugins: corral.PluginSet
) -> None:
    counted: list[tuple[str, str]] = []

    class Counting(corral.WorkspaceMetrics):
        def inc_tool_call(self, tool: str, status: str) -> None:
            counted.append((tool, status))

    ts = toolset(provider, plugins, {"fs": True}, observers=[corral.MetricsSink(Counting())])
    await ts.call("workspace_write_file", {"path": "/a", "content": "x"})
    await ts.call("workspace_stat", {"path": "/nope"})
    assert counted == [("workspace_write_file", "ok"), ("workspace_stat", "error")]


async def test_trace_context_reaches_log_records(
    provider: Any, plugins: corral.PluginSet, caplog: pytest.LogCaptureFixture
) -> None:
    ts = toolset(
        provider, plugins, {"fs": True}, trace_context={"trace_id": "t-1", "name": "clash"}
    )
    with caplog.at_level(logging.INFO, logger="corral.tools"):
        await ts.call("workspace_read_file", {"path": "/nope"})
    record = next(r for r in caplog.records if r.name == "corral.tools")
    assert record.trace_id == "t-1"  # type: ignore[attr-defined]
    assert record.trace_name == "clash"  # type: ignore[attr-defined]


async def test_result_filter_scrubs_results(provider: Any, plugins: corral.PluginSet) -> None:
    def scrub(name: str, args: Any, result: ToolResult) -> ToolResult:
        return ToolResult(result.content.replace("SECRET", "[redacted]"), result.is_error)

    ts = toolset(provider, plugins, {"fs": True}, result_filter=scrub)
    await ts.call("workspace_write_file", {"path": "/a", "content": "the SECRET is here"})
    assert (
        await ts.call("workspace_read_file", {"path": "/a"})
    ).content == "the [redacted] is here"


async def test_failing_result_filter_withholds_the_result(
    provider: Any, plugins: corral.PluginSet
) -> None:
    async def broken(name: str, args: Any, result: ToolResult) -> ToolResult:
        raise RuntimeError("filter bug")

    ts = toolset(provider, plugins, {"fs": True}, result_filter=broken)
    await ts.call("workspace_write_file", {"path": "/a", "content": "SECRET"})
    result = await ts.call("workspace_read_file", {"path": "/a"})
    assert result.is_error
    assert "SECRET" not in result.content


async def test_shell_policy_shapes_the_request(provider: Any, plugins: corral.PluginSet) -> None:
    ts = toolset(
        provider,
        plugins,
        {"shell": {"allowed_commands": ["ls", "cat"], "timeout_s": 5, "env": {"A": "1"}}},
    )
    ok = await ts.call("workspace_run", {"command": "ls -la", "cwd": "sub", "env": {"B": "2"}})
    assert not ok.is_error
    assert provider.last_shell is not None
    request = provider.last_shell.requests[-1]
    assert request.cwd == "/sub"
    assert request.env == {"A": "1", "B": "2"}
    assert request.timeout_s == 5
    assert request.allowed_commands == frozenset({"ls", "cat"})
    denied = await ts.call("workspace_run", {"command": "curl http://x"})
    assert denied.error_code == "policy_denied"
    assert "'curl' is not in the allowed commands" in denied.content
    sneaky = await ts.call("workspace_run", {"command": "/usr/bin/curl x"})
    assert sneaky.error_code == "policy_denied"
    too_long = await ts.call("workspace_run", {"command": "ls", "timeout_s": 50})
    assert too_long.error_code == "invalid_argument"
    bad_env = await ts.call("workspace_run", {"command": "ls", "env": {"A=B": "x"}})
    assert bad_env.error_code == "invalid_argument"
    assert len(provider.last_shell.requests) == 1


async def test_exporters_match_the_tools(provider: Any, plugins: corral.PluginSet) -> None:
    ts = toolset(provider, plugins, {"fs": True, "shell": True})
    openai = ts.openai_tools()
    anthropic = ts.anthropic_tools()
    assert [t["function"]["name"] for t in openai] == [t.name for t in ts.tools]
    assert [t["name"] for t in anthropic] == [t.name for t in ts.tools]
    read = next(t for t in anthropic if t["name"] == "workspace_read_file")
    assert read["input_schema"]["required"] == ["path"]
    assert openai[0]["type"] == "function"


async def test_inherited_toolset_runs_its_own_pipeline(
    provider: Any, plugins: corral.PluginSet
) -> None:
    seen = RecordingObserver()

    def tag(name: str, args: Any, result: ToolResult) -> ToolResult:
        return ToolResult("[child] " + result.content, result.is_error, result.data)

    parent = toolset(
        provider, plugins, {"fs": True}, observers=[seen], trace_context={"span_id": "parent"}
    )
    child = parent.inherit(trace_context={"span_id": "child"}, result_filter=tag)
    assert child.tool("workspace_read_file") is not parent.tool("workspace_read_file")
    await parent.call("workspace_write_file", {"path": "/a", "content": "x"})
    assert (await child.call("workspace_read_file", {"path": "/a"})).content == "[child] x"
    assert (await parent.call("workspace_read_file", {"path": "/a"})).content == "x"
    spans = [(c.tool, c.trace["span_id"]) for c in seen.of_type(corral.ToolCallFinished)]
    assert spans == [
        ("workspace_write_file", "parent"),
        ("workspace_read_file", "child"),
        ("workspace_read_file", "parent"),
    ]
    # By default a child keeps the parent's trace context and filter.
    grandchild = child.inherit()
    assert (await grandchild.call("workspace_read_file", {"path": "/a"})).content == "[child] x"
    assert seen.of_type(corral.ToolCallFinished)[-1].trace == {"span_id": "child"}


async def test_inherited_toolset_does_not_close_parent(
    provider: Any, plugins: corral.PluginSet
) -> None:
    parent = toolset(provider, plugins, {"fs": True})
    child = parent.inherit()
    await child.call("workspace_write_file", {"path": "/shared", "content": "from child"})
    await child.aclose()
    assert parent.registry.state == "open"
    assert (await parent.call("workspace_read_file", {"path": "/shared"})).content == "from child"
    await parent.aclose()
    assert parent.registry.state == "closed"


def test_reserved_prefixes_are_refused(provider: Any, plugins: corral.PluginSet) -> None:
    ts = toolset(provider, plugins, {"fs": True})
    ts.check_user_tools(["notes_write", "my_tool"])
    for name in ("workspace_mine", "companion__helper"):
        with pytest.raises(corral.ConfigError, match="reserved"):
            ts.check_user_tools([name])


@pytest.mark.parametrize(
    ("caps", "message"),
    [
        ({"gitx": True}, "unknown capability 'gitx'"),
        ({"shell": {"timeout": 3}}, "capabilities.shell: unknown option 'timeout'"),
        ({"shell": {"timeout_s": "3"}}, "capabilities.shell.timeout_s: expected a finite number"),
        ({"shell": {"timeout_s": -1}}, "timeout_s must be a number greater than 0"),
        ({"fs": "yes"}, "capabilities.fs: expected true or an object"),
        ({"script": {"network": "sometimes"}}, "capabilities.script"),
    ],
)
def test_bad_capability_config_names_the_key(
    provider: Any, plugins: corral.PluginSet, caps: dict[str, Any], message: str
) -> None:
    with pytest.raises(corral.ConfigError, match=message):
        toolset(provider, plugins, caps)


async def test_ok_calls_reach_the_log_exactly_when_debug_is_on(
    provider: Any, plugins: corral.PluginSet, caplog: pytest.LogCaptureFixture
) -> None:
    # With only the log sink subscribed, an ok call builds no event while DEBUG
    # is off (the fast path); turning DEBUG on must bring its record back at once.
    ts = toolset(provider, plugins, {"fs": True})
    await ts.call("workspace_write_file", {"path": "/a", "content": "x"})
    with caplog.at_level(logging.INFO, logger="corral.tools"):
        assert not ts.registry.observes_ok_tool_calls()
        await ts.call("workspace_read_file", {"path": "/a"})
        await ts.call("workspace_read_file", {"path": "/missing"})
    assert [r.getMessage().split(" in ")[0] for r in caplog.records] == [
        "workspace tool workspace_read_file error"
    ]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="corral.tools"):
        assert ts.registry.observes_ok_tool_calls()
        await ts.call("workspace_read_file", {"path": "/a"})
    assert [r.getMessage().split(" in ")[0] for r in caplog.records] == [
        "workspace tool workspace_read_file ok"
    ]


def test_an_event_stream_observes_ok_calls_unless_every_sink_ignores_them() -> None:
    class Ignoring:
        def __init__(self) -> None:
            self.ignoring = True

        def ignores_ok_tool_calls(self) -> bool:
            return self.ignoring

        def __call__(self, event: corral.Event) -> None:
            pass

    async def async_sink(event: corral.Event) -> None:
        pass

    quiet = Ignoring()
    stream = EventStream([quiet])
    assert not stream.observes_ok_tool_calls()
    quiet.ignoring = False  # asked on every call, not once
    assert stream.observes_ok_tool_calls()
    quiet.ignoring = True
    stream.subscribe(lambda event: None)  # a plain sink wants everything
    assert stream.observes_ok_tool_calls()
    assert EventStream([Ignoring(), Ignoring()]).observes_ok_tool_calls() is False
    assert EventStream([Ignoring(), async_sink]).observes_ok_tool_calls()
