"""The ``script`` module (where advertised): ephemeral, stateless, no files, no network."""

from __future__ import annotations

import json
import secrets
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

import anyio
import pytest

from corral import ExecResult, OperationError
from corral.provider import CodeInterpreter

from ._harness import Harness
from ._rules import define, rule

__all__ = ["AbstractScriptTests"]

_W = "Workspace.script"
_R = "corral._data.ExecResult"
STATELESS = define(
    "script.state.fresh",
    _W,
    "Each script runs in a fresh isolate: nothing a call sets (globals, prototypes, "
    "built-ins) is seen by a later call.",
)
NO_FILES = define(
    "script.files.none",
    _W,
    "A script sees no file system: no API it has reads a host file or leaves one behind.",
)
NO_NETWORK = define(
    "script.network.none",
    _W,
    "A script reaches no network: a server listening on loopback receives no connection.",
)
LOOP_BUDGET = define(
    "script.budget.time",
    _W,
    "A script that never ends is stopped at its timeout: timed_out=True, exit_code None, "
    "the output it wrote before kept, and the runner usable afterwards.",
)
MEMORY_BUDGET = define(
    "script.budget.memory",
    _W,
    "An allocation bomb or an unbounded recursion ends within the budget as an error or a "
    "timeout, never a crash of the host, and the runner is usable afterwards.",
)
ERRORS = define(
    "script.errors.fields",
    _R,
    "An uncaught error gives exit_code 1 and error with the error's name, its message as "
    "value and a traceback that starts with 'name: message'.",
)
CONSOLE = define(
    "script.output.console",
    _R,
    "console.log output is captured in stdout and console.error in stderr, in order.",
)
RESULT = define(
    "script.result.json",
    _R,
    "result_json is the JSON text of the script's last expression (awaited when a promise), "
    "None when it has no JSON form; success is exit_code 0.",
)
LANGUAGE = define(
    "script.language.unknown",
    "CodeInterpreter.run_code",
    "A language the runner lacks is an OperationError naming the available languages; the "
    "runner's languages property lists exactly those it accepts.",
)

_JS: Final = "javascript"
_TIMEOUT: Final = 30.0
_BUDGET: Final = 1.0
_SLACK: Final = 10.0
"""How far past its timeout a stopped script may return, at most (a loaded CI machine)."""


def _runner(opened: Any) -> CodeInterpreter:
    script = opened.workspace.script
    assert script is not None
    return script  # type: ignore[no-any-return]


def _js(h: Harness, script: CodeInterpreter) -> None:
    if _JS not in script.languages:
        pytest.skip(f"provider {h.kind}'s script runner has no JavaScript")


async def _run(
    h: Harness, script: CodeInterpreter, code: str, timeout_s: float = _TIMEOUT
) -> ExecResult:
    return await h.call(script.run_code, _JS, code, timeout_s=timeout_s)


def _everything(result: ExecResult) -> str:
    return f"{result.stdout}{result.stderr}{result.result_json or ''}{result.error or ''}"


class AbstractScriptTests:
    """The ``script`` rules for providers that advertise it."""

    @rule(STATELESS)
    @pytest.mark.anyio
    async def test_script_keeps_no_state(self, conformance: Harness) -> None:
        """A later call sees nothing an earlier one set."""
        h = conformance
        h.require("script")
        async with h.session("script") as opened:
            script = _runner(opened)
            _js(h, script)
            mark = secrets.token_hex(4)
            first = await _run(
                h,
                script,
                f"globalThis.leak_{mark} = 1; Object.prototype.polluted_{mark} = 2; "
                "JSON.stringify = () => 'hijacked'; 0",
            )
            assert first.exit_code == 0, f"the setting script failed: {first!r}"
            second = await _run(
                h, script, f"[typeof leak_{mark}, typeof ({{}}).polluted_{mark}, JSON.stringify(1)]"
            )
            assert second.result_json is not None, f"no result: {second!r}"
            assert json.loads(second.result_json) == ["undefined", "undefined", "1"], (
                f"state from an earlier call is visible: {second.result_json}"
            )

    @rule(NO_FILES)
    @pytest.mark.anyio
    async def test_script_sees_no_files(self, conformance: Harness) -> None:
        """Every file API a JavaScript runtime may have finds nothing and leaves nothing."""
        h = conformance
        h.require("script")
        with tempfile.TemporaryDirectory() as scratch:
            await self._no_files(h, Path(scratch))

    async def _no_files(self, h: Harness, tmp_path: Path) -> None:
        secret = tmp_path / "secret.txt"
        canary = f"canary-{secrets.token_hex(8)}"
        secret.write_text(canary)
        planted = tmp_path / "planted.txt"
        attempts = {
            "require": "require('fs').readFileSync(P, 'utf8')",
            "deno": "Deno.readTextFileSync(P)",
            "qjs std": "import('qjs:std').then(s => s.loadFile(P))",
            "qjs os": "import('qjs:os').then(o => o.readdir('/'))",
            "import": "import(P)",
            "write": "import('qjs:std').then(s => { const f = s.open(W, 'w'); f.puts('x'); "
            "f.close() })",
        }
        async with h.session("script") as opened:
            script = _runner(opened)
            _js(h, script)
            for name, expr in attempts.items():
                code = expr.replace("P", json.dumps(str(secret))).replace(
                    "W", json.dumps(str(planted))
                )
                result = await _run(h, script, f"(async () => {{ return await {code} }})()")
                assert canary not in _everything(result), f"{name}: the script read a host file"
                assert "root:" not in _everything(result), f"{name}: the script read /etc/passwd"
                assert not result.timed_out, f"{name}: a file attempt hung"
            assert not planted.exists(), "a script created a file on the host"

    @rule(NO_NETWORK)
    @pytest.mark.anyio
    async def test_script_reaches_no_network(self, conformance: Harness) -> None:
        """A loopback server sees no connection from any network API."""
        h = conformance
        h.require("script")
        server = socket.create_server(("127.0.0.1", 0))
        server.settimeout(0.05)
        port = server.getsockname()[1]
        accepted: list[object] = []
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    connection, _ = server.accept()
                except TimeoutError:
                    continue
                accepted.append(connection)
                connection.close()

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{port}/"
        attempts = [
            f"fetch({json.dumps(url)})",
            f"import({json.dumps(url)})",
            f"new Promise(r => require('net').connect({port}, '127.0.0.1', r))",
            f"new Promise(r => {{ const x = new XMLHttpRequest(); x.open('GET', "
            f"{json.dumps(url)}); x.onload = r; x.send(); }})",
        ]
        try:
            async with h.session("script") as opened:
                script = _runner(opened)
                _js(h, script)
                for code in attempts:
                    await _run(h, script, f"(async () => {{ await {code} }})()", timeout_s=5)
                await anyio.sleep(0.2)  # a connection in flight reaches accept()
        finally:
            stop.set()
            thread.join()
            server.close()
        assert not accepted, f"a script connected to loopback ({len(accepted)} connections)"

    @rule(LOOP_BUDGET)
    @pytest.mark.anyio
    async def test_script_infinite_loop_is_stopped(self, conformance: Harness) -> None:
        """An endless loop ends at the timeout, reported as such."""
        h = conformance
        h.require("script")
        async with h.session("script") as opened:
            script = _runner(opened)
            _js(h, script)
            started = time.monotonic()
            result = await _run(h, script, "console.log('begun'); for (;;) {}", _BUDGET)
            elapsed = time.monotonic() - started
            assert result.timed_out, f"an endless loop was not reported as a timeout: {result!r}"
            assert result.exit_code is None, f"a timeout has exit_code {result.exit_code!r}"
            assert result.stdout.startswith("begun"), "output before the timeout was lost"
            assert elapsed < _BUDGET + _SLACK, f"a {_BUDGET} s budget took {elapsed:.1f} s"
            after = await _run(h, script, "40 + 2")
            assert after.result_json == "42", f"the runner is unusable after a timeout: {after!r}"

    @rule(MEMORY_BUDGET)
    @pytest.mark.anyio
    async def test_script_bombs_end_within_budget(self, conformance: Harness) -> None:
        """Allocation and recursion bombs end as errors or timeouts; the host carries on."""
        h = conformance
        h.require("script")
        bombs = {
            "strings": "const a = []; for (;;) a.push('x'.repeat(1 << 20) + a.length)",
            "arrays": "const b = []; for (;;) b.push(new Float64Array(1 << 18))",
            "buffer": "new ArrayBuffer(2 ** 32)",
            "recursion": "function f(n) { return f(n + 1) + 1 } f(0)",
        }
        async with h.session("script") as opened:
            script = _runner(opened)
            _js(h, script)
            for name, code in bombs.items():
                started = time.monotonic()
                result = await _run(h, script, code, 10.0)
                elapsed = time.monotonic() - started
                assert result.error is not None or result.timed_out, (
                    f"{name}: the bomb neither failed nor timed out: {result!r}"
                )
                assert elapsed < 10.0 + _SLACK, f"{name}: took {elapsed:.1f} s"
            after = await _run(h, script, "'still here'")
            assert after.result_json == '"still here"', f"the runner broke: {after!r}"

    @rule(ERRORS)
    @pytest.mark.anyio
    async def test_script_errors_carry_name_value_traceback(self, conformance: Harness) -> None:
        """An uncaught error is described by name, value and traceback."""
        h = conformance
        h.require("script")
        async with h.session("script") as opened:
            script = _runner(opened)
            _js(h, script)
            result = await _run(
                h, script, "function deep() { throw new RangeError('out of range') }\ndeep()"
            )
            assert result.exit_code == 1, f"an uncaught error has exit_code {result.exit_code!r}"
            assert result.error is not None, f"no error reported: {result!r}"
            assert result.error.name == "RangeError", f"error name {result.error.name!r}"
            assert result.error.value == "out of range", f"error value {result.error.value!r}"
            assert result.error.traceback.startswith("RangeError: out of range"), (
                f"traceback {result.error.traceback!r}"
            )
            assert result.result_json is None, "a failed script also reported a result"

    @rule(CONSOLE)
    @pytest.mark.anyio
    async def test_script_console_is_captured(self, conformance: Harness) -> None:
        """console.log to stdout, console.error to stderr."""
        h = conformance
        h.require("script")
        async with h.session("script") as opened:
            script = _runner(opened)
            _js(h, script)
            result = await _run(
                h, script, "console.log('one'); console.error('two'); console.log('three', 4)"
            )
            assert result.exit_code == 0, f"{result!r}"
            assert result.stdout == "one\nthree 4\n", f"stdout was {result.stdout!r}"
            assert result.stderr == "two\n", f"stderr was {result.stderr!r}"
            assert not result.stdout_truncated, "small stdout marked truncated"

    @rule(RESULT)
    @pytest.mark.anyio
    async def test_script_result_is_the_last_expression(self, conformance: Harness) -> None:
        """The last expression's value comes back as JSON; a promise is awaited."""
        h = conformance
        h.require("script")
        cases = {
            "const x = {a: [1, 'b', null]}; x": {"a": [1, "b", None]},
            "Promise.resolve(6).then(v => v * 7)": 42,
            "'text'": "text",
        }
        async with h.session("script") as opened:
            script = _runner(opened)
            _js(h, script)
            for code, want in cases.items():
                result = await _run(h, script, code)
                assert result.exit_code == 0, f"{code!r}: {result!r}"
                assert result.result_json is not None, f"{code!r}: no result"
                assert json.loads(result.result_json) == want, (
                    f"{code!r}: result {result.result_json!r}"
                )
            nothing = await _run(h, script, "undefined")
            assert nothing.result_json is None, f"undefined gave {nothing.result_json!r}"

    @rule(LANGUAGE)
    @pytest.mark.anyio
    async def test_script_unknown_language_lists_available(self, conformance: Harness) -> None:
        """Asking for a language the runner lacks names the ones it has."""
        h = conformance
        h.require("script")
        async with h.session("script") as opened:
            script = _runner(opened)
            languages = sorted(script.languages)
            assert languages, "the script runner accepts no language"
            with pytest.raises(OperationError) as info:
                await h.call(script.run_code, "cobol-85", "1", timeout_s=5)
            for language in languages:
                assert language in str(info.value), (
                    f"the error does not name the available language {language!r}: {info.value}"
                )
