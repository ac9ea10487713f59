"""The script runner's semantics: result, console, errors, caps, languages, lifecycle."""

from __future__ import annotations

import json

import pytest

import corral
from corral_isolate import IsolateProvider, ScriptLimits

pytestmark = pytest.mark.anyio


async def test_result_is_the_last_expression_as_json(run) -> None:
    result = await run("const a = [1, 2]; a.map(x => x * 2)")
    assert result.exit_code == 0
    assert json.loads(result.result_json) == [2, 4]
    assert result.error is None
    assert not result.timed_out


async def test_promise_result_is_awaited(run) -> None:
    result = await run("(async () => { await null; return {ok: true}; })()")
    assert json.loads(result.result_json) == {"ok": True}


@pytest.mark.parametrize("code", ["undefined", "let x = 1;", "(() => {})"])
async def test_no_json_value_gives_no_result(run, code: str) -> None:
    result = await run(code)
    assert result.exit_code == 0
    assert result.result_json is None


async def test_console_goes_to_stdout_and_stderr(run) -> None:
    result = await run("console.log('out', 1, {a: 2}); console.error('err'); console.warn('w')")
    assert result.stdout == 'out 1 {"a":2}\n'
    assert result.stderr == "err\nw\n"


async def test_errors_carry_name_value_and_traceback(run) -> None:
    result = await run("console.log('before');\nfunction f() { throw new TypeError('boom'); }\nf()")
    assert result.exit_code == 1
    assert result.stdout == "before\n"
    assert result.error is not None
    assert (result.error.name, result.error.value) == ("TypeError", "boom")
    assert result.error.traceback.startswith("TypeError: boom\n")
    assert "at f" in result.error.traceback
    assert "cmdline" not in result.error.traceback, "the wrapper's frames leak into the traceback"


@pytest.mark.parametrize(
    ("code", "name", "value"),
    [
        ("throw 42", "Error", "42"),
        ("Promise.reject(new RangeError('no'))", "RangeError", "no"),
        ("1n", "TypeError", "BigInt are forbidden in JSON.stringify"),
        ("const o = {}; o.o = o; o", "TypeError", None),
        ("syntax error here", "SyntaxError", None),
    ],
)
async def test_uncaught_values_and_bad_results_are_errors(
    run, code: str, name: str, value: str | None
) -> None:
    result = await run(code)
    assert result.exit_code == 1
    assert result.error is not None
    assert result.error.name == name
    if value is not None:
        assert result.error.value == value


async def test_a_script_cannot_forge_frames(run) -> None:
    result = await run('console.log(\'["r","666"]\'); typeof print + typeof globalThis.print')
    assert json.loads(result.result_json) == "undefinedundefined"
    assert result.stdout == '["r","666"]\n'


async def test_output_cap_is_exact_and_flagged(run) -> None:
    exact = await run("console.log('a'.repeat(999))")  # 1000 bytes with the newline
    assert exact.stdout == "a" * 999 + "\n"
    assert not exact.stdout_truncated
    over = await run("console.log('a'.repeat(1000)); console.error('é'.repeat(2000))")
    assert over.stdout_truncated
    assert over.stdout.startswith("a" * 1000)
    assert len(over.stdout.encode()) <= 1000 + 200
    assert over.stderr_truncated
    assert len(over.stderr.encode()) <= 1000 + 200


async def test_result_over_the_cap_is_an_error(run) -> None:
    result = await run("'x'.repeat(5000)")
    assert result.result_json is None
    assert result.error is not None
    assert result.error.name == "RangeError"


async def test_language_it_lacks_lists_the_available_ones(runner) -> None:
    with pytest.raises(corral.OperationError) as info:
        await runner.run_code("python", "1", timeout_s=1)
    assert info.value.code == "invalid_argument"
    assert "available: javascript" in str(info.value)
    assert runner.languages == frozenset({"javascript"})


async def test_details_name_the_languages(provider: IsolateProvider) -> None:
    opened = await provider.open(corral.ProviderConfig("isolate"), corral.SessionRef("d"))
    assert opened.workspace.details()["languages"] == ["javascript"]  # type: ignore[attr-defined]
    await opened.workspace.close()


async def test_closed_workspace_refuses_and_does_not_resolve(provider: IsolateProvider) -> None:
    opened = await provider.open(corral.ProviderConfig("isolate"), corral.SessionRef("c"))
    again = await provider.resolve(opened.ref)
    assert again.id == opened.workspace.id
    await opened.workspace.close()
    with pytest.raises(corral.OperationError) as info:
        await opened.workspace.script.run_code("javascript", "1", timeout_s=1)  # type: ignore[union-attr]
    assert info.value.code == "closed"
    with pytest.raises(corral.WorkspaceFailedError):
        await provider.resolve(opened.ref)


async def test_other_capabilities_are_refused(provider: IsolateProvider) -> None:
    with pytest.raises(corral.WorkspaceFailedError, match="cannot provide capabilities: fs"):
        await provider.open(
            corral.ProviderConfig("isolate"), corral.SessionRef("x"), frozenset({"fs"})
        )


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="memory_bytes"):
        ScriptLimits(memory_bytes=1 << 20)
    with pytest.raises(ValueError, match="max_timeout_s"):
        ScriptLimits(max_timeout_s=0)
    with pytest.raises(ValueError, match="max_output_bytes"):
        IsolateProvider(max_output_bytes=True)


async def test_through_the_tool_the_model_sees_result_and_error() -> None:
    async with corral.open_workspace("isolate", {"script": True}, session_id="tool-test") as ws:
        ok = await ws.call("workspace_script", {"code": "console.log('hi'); 6 * 7"})
        assert not ok.is_error, ok.content
        assert ok.data["result"] == 42
        assert ok.data["stdout"] == "hi\n"
        bad = await ws.call("workspace_script", {"code": "null.x"})
        assert bad.data["error"]["name"] == "TypeError"
        lang = await ws.call("workspace_script", {"code": "1", "language": "ruby"})
        assert lang.is_error
        assert "javascript" in lang.content


async def test_a_policy_that_asks_for_the_network_is_refused_on_an_offline_runner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tool tells the model scripts are online: they never run offline instead."""
    caps = {"script": {"network": "on"}}
    async with corral.open_workspace("isolate", caps, session_id="net-test") as ws:
        refused = await ws.call("workspace_script", {"code": "6 * 7"})
        assert refused.is_error
        assert refused.error_code == "unsupported"
        assert "network" in refused.content
        from corral_isolate._runner import ScriptRunner

        monkeypatch.setattr(ScriptRunner, "has_network", True)  # a runner that says it has one
        ran = await ws.call("workspace_script", {"code": "6 * 7"})
        assert not ran.is_error, ran.content
        assert ran.data["result"] == 42
    async with corral.open_workspace("isolate", {"script": True}, session_id="net-off") as ws:
        assert not (await ws.call("workspace_script", {"code": "1"})).is_error


async def test_contexts_are_refused(runner) -> None:
    for call in (
        runner.create_context("javascript"),
        runner.run_in_context("c", "1", timeout_s=1),
        runner.delete_context("c"),
    ):
        with pytest.raises(corral.OperationError) as info:
            await call
        assert info.value.code == "unsupported"
