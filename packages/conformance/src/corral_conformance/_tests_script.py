"""The ``script`` module (where advertised): ephemeral, stateless, no files, no network.

Every rule runs once per language the runner offers among those it knows how
to speak (JavaScript: the isolate and node; Python: ``python3 -I`` in a box),
so a provider with a Python-only runner is held to the same contract.
Python follows the same result contract as JavaScript: stdout/stderr as
printed, the last statement's value (when it is an expression; a coroutine
is awaited) as JSON.
"""

from __future__ import annotations

import json
import re
import secrets
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import anyio
import pytest

from corral import ExecResult, OperationError
from corral.provider import CodeInterpreter

from ._harness import Harness
from ._loopback import loopback_listener
from ._rules import define, rule

__all__ = ["AbstractScriptTests"]

_W = "Workspace.script"
_R = "corral._data.ExecResult"
STATELESS = define(
    "script.state.fresh",
    _W,
    "Each script runs in a fresh isolate or box: nothing a call sets (globals, prototypes, "
    "built-ins, files it writes) is seen by a later call.",
)
NO_FILES = define(
    "script.files.none",
    _W,
    "A script sees no file system of the host's or the workspace's: no API it has reads a "
    "host file or a workspace file, or leaves a file behind.",
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
    "value and a traceback showing 'name: message' where the language prints it (the "
    "first line in JavaScript, the last in Python).",
)
CONSOLE = define(
    "script.output.console",
    _R,
    "console.log (print) output is captured in stdout and console.error (print to stderr) "
    "in stderr, in order.",
)
RESULT = define(
    "script.result.json",
    _R,
    "result_json is the JSON text of the script's last expression (awaited when a promise "
    "or coroutine), None when it has no JSON form or is undefined/None; success is "
    "exit_code 0.",
)
LANGUAGE = define(
    "script.language.unknown",
    "CodeInterpreter.run_code",
    "A language the runner lacks is an OperationError naming the available languages; the "
    "runner's languages property lists exactly those it accepts.",
)

_JS: Final = "javascript"
_PY: Final = "python"
_KNOWN: Final[tuple[str, ...]] = (_JS, _PY)
_TIMEOUT: Final = 30.0
_BUDGET: Final = 1.0
_SLACK: Final = 10.0
"""How far past its timeout a stopped script may return, at most (a loaded CI machine)."""


def _runner(opened: Any) -> CodeInterpreter:
    script = opened.workspace.script
    assert script is not None
    return script  # type: ignore[no-any-return]


def _languages(h: Harness, script: CodeInterpreter) -> list[str]:
    """The languages of the runner these rules can speak; skip when there is none."""
    spoken = [lang for lang in _KNOWN if lang in script.languages]
    if not spoken:
        pytest.skip(f"provider {h.kind}'s script runner has neither JavaScript nor Python")
    return spoken


async def _run(
    h: Harness, script: CodeInterpreter, code: str, timeout_s: float = _TIMEOUT, lang: str = _JS
) -> ExecResult:
    return await h.call(script.run_code, lang, code, timeout_s=timeout_s)


def _everything(result: ExecResult) -> str:
    return f"{result.stdout}{result.stderr}{result.result_json or ''}{result.error or ''}"


def _lit(value: object) -> str:
    """A literal both languages read (a JSON string or number)."""
    return json.dumps(value)


def _fill(template: str, **literals: str) -> str:
    """``template`` with each standalone placeholder letter replaced by its literal, in one pass.

    One pass, so a literal that itself holds a placeholder letter (a temp dir named
    ``/tmp/tmp.Wx3``) is never filled again; whole words only, so ``Path`` stays ``Path``.
    """
    return re.sub(r"\b[A-Z]\b", lambda m: literals.get(m[0], m[0]), template)


def _workspace_paths(opened: Any, name: str) -> list[str]:
    """Where a workspace file could be named from inside a box: relative, and absolute."""
    describe = getattr(opened.workspace, "details", None)
    details: Mapping[str, Any] = describe() if callable(describe) else {}
    paths = [name]
    for key in ("workspace_path", "root"):
        where = details.get(key)
        if isinstance(where, str) and where.startswith("/"):
            paths.append(f"{where.rstrip('/')}/{name}")
    return paths


class AbstractScriptTests:
    """The ``script`` rules for providers that advertise it."""

    @rule(STATELESS)
    @pytest.mark.anyio
    async def test_script_keeps_no_state(self, conformance: Harness) -> None:
        """A later call sees nothing an earlier one set."""
        h = conformance
        h.require("script")
        mark = secrets.token_hex(4)
        setting = {
            _JS: f"globalThis.leak_{mark} = 1; Object.prototype.polluted_{mark} = 2; "
            "JSON.stringify = () => 'hijacked'; 0",
            _PY: f"import builtins, json, os, sys\nbuiltins.leak_{mark} = 1\n"
            "json.dumps = lambda *a, **k: 'hijacked'\n"
            f"for d in ('.', '/tmp', os.path.expanduser('~')):\n"
            f"    try:\n        open(os.path.join(d, 'leak_{mark}'), 'w').write('x')\n"
            "    except OSError:\n        pass\n0",
        }
        probing = {
            _JS: f"[typeof leak_{mark}, typeof ({{}}).polluted_{mark}, JSON.stringify(1)]",
            _PY: f"import builtins, json, os\n[hasattr(builtins, 'leak_{mark}'), "
            f"any(os.path.exists(os.path.join(d, 'leak_{mark}')) "
            "for d in ('.', '/tmp', os.path.expanduser('~'))), json.dumps(1)]",
        }
        clean = {_JS: ["undefined", "undefined", "1"], _PY: [False, False, "1"]}
        async with h.session("script") as opened:
            script = _runner(opened)
            for lang in _languages(h, script):
                first = await _run(h, script, setting[lang], lang=lang)
                assert first.exit_code == 0, f"{lang}: the setting script failed: {first!r}"
                second = await _run(h, script, probing[lang], lang=lang)
                assert second.result_json is not None, f"{lang}: no result: {second!r}"
                assert json.loads(second.result_json) == clean[lang], (
                    f"{lang}: state from an earlier call is visible: {second.result_json}"
                )

    @rule(NO_FILES)
    @pytest.mark.anyio
    async def test_script_sees_no_files(self, conformance: Harness) -> None:
        """Every file API a runtime may have finds nothing and leaves nothing."""
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
            _JS: {
                "require": "require('fs').readFileSync(P, 'utf8')",
                "deno": "Deno.readTextFileSync(P)",
                "qjs std": "import('qjs:std').then(s => s.loadFile(P))",
                "qjs os": "import('qjs:os').then(o => o.readdir('/'))",
                "import": "import(P)",
                "write": "import('qjs:std').then(s => { const f = s.open(W, 'w'); f.puts('x'); "
                "f.close() })",
                "node write": "require('fs').writeFileSync(W, 'x')",
            },
            _PY: {
                "open": "open(P).read()",
                "listdir": "__import__('os').listdir(__import__('os').path.dirname(P))",
                "pathlib": "__import__('pathlib').Path(P).read_text()",
                "write": "open(W, 'w').write('x')",
            },
        }
        # Where the provider also has a workspace, its files are out of reach too.
        workspace = "fs" in h.advertised
        wanted = ("script", "fs") if workspace else ("script",)
        inside = f"inside-{secrets.token_hex(8)}"
        async with h.session(*wanted) as opened:
            script = _runner(opened)
            targets = [str(secret)]
            if workspace:
                name = f"ws-secret-{secrets.token_hex(4)}.txt"
                fs = opened.workspace.fs
                assert fs is not None, "declared fs but the workspace has no file tools"
                await h.call(fs.write_file, name, inside.encode())
                targets += _workspace_paths(opened, name)
            for lang in _languages(h, script):
                for target in targets:
                    for what, expr in attempts[lang].items():
                        code = _fill(expr, P=_lit(target), W=_lit(str(planted)))
                        if lang == _JS:
                            code = f"(async () => {{ return await {code} }})()"
                        result = await _run(h, script, code, lang=lang)
                        seen = _everything(result)
                        assert canary not in seen, f"{lang} {what}: the script read a host file"
                        assert inside not in seen, (
                            f"{lang} {what}: the script read a workspace file"
                        )
                        assert "root:" not in seen, f"{lang} {what}: the script read /etc/passwd"
                        assert not result.timed_out, f"{lang} {what}: a file attempt hung"
            assert not planted.exists(), "a script created a file on the host"

    @rule(NO_NETWORK)
    @pytest.mark.anyio
    async def test_script_reaches_no_network(self, conformance: Harness) -> None:
        """A loopback server sees no connection from any network API."""
        h = conformance
        h.require("script")
        with loopback_listener() as witness:
            port = witness.port
            url = f"http://127.0.0.1:{port}/"
            attempts = {
                _JS: [
                    f"(async () => {{ await {code} }})()"
                    for code in (
                        f"fetch({json.dumps(url)})",
                        f"import({json.dumps(url)})",
                        f"new Promise(r => require('net').connect({port}, '127.0.0.1', r))",
                        f"new Promise(r => {{ const x = new XMLHttpRequest(); x.open('GET', "
                        f"{json.dumps(url)}); x.onload = r; x.send(); }})",
                    )
                ],
                _PY: [
                    f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)",
                    f"import urllib.request\nurllib.request.urlopen({json.dumps(url)}, timeout=3)",
                    f"import socket\ns = socket.socket(socket.AF_INET6)\n"
                    f"s.settimeout(3)\ns.connect(('::ffff:127.0.0.1', {port}))",
                ],
            }
            async with h.session("script") as opened:
                script = _runner(opened)
                for lang in _languages(h, script):
                    for code in attempts[lang]:
                        await _run(h, script, code, timeout_s=5, lang=lang)
                await anyio.sleep(0.2)  # a connection in flight reaches accept()
        assert not witness.accepted, (
            f"a script connected to loopback ({witness.accepted} connections)"
        )

    @rule(LOOP_BUDGET)
    @pytest.mark.anyio
    async def test_script_infinite_loop_is_stopped(self, conformance: Harness) -> None:
        """An endless loop ends at the timeout, reported as such."""
        h = conformance
        h.require("script")
        loops = {_JS: "console.log('begun'); for (;;) {}", _PY: "print('begun')\nwhile True: pass"}
        answers = {_JS: "40 + 2", _PY: "40 + 2"}
        async with h.session("script") as opened:
            script = _runner(opened)
            for lang in _languages(h, script):
                started = time.monotonic()
                result = await _run(h, script, loops[lang], _BUDGET, lang=lang)
                elapsed = time.monotonic() - started
                assert result.timed_out, (
                    f"{lang}: an endless loop was not reported as a timeout: {result!r}"
                )
                assert result.exit_code is None, (
                    f"{lang}: a timeout has exit_code {result.exit_code!r}"
                )
                assert result.stdout.startswith("begun"), f"{lang}: output before the timeout lost"
                assert elapsed < _BUDGET + _SLACK, (
                    f"{lang}: a {_BUDGET} s budget took {elapsed:.1f} s"
                )
                after = await _run(h, script, answers[lang], lang=lang)
                assert after.result_json == "42", (
                    f"{lang}: the runner is unusable after a timeout: {after!r}"
                )

    @rule(MEMORY_BUDGET)
    @pytest.mark.anyio
    async def test_script_bombs_end_within_budget(self, conformance: Harness) -> None:
        """Allocation and recursion bombs end as errors or timeouts; the host carries on."""
        h = conformance
        h.require("script")
        bombs = {
            _JS: {
                "strings": "const a = []; for (;;) a.push('x'.repeat(1 << 20) + a.length)",
                "arrays": "const b = []; for (;;) b.push(new Float64Array(1 << 18))",
                # Touched, so a runtime that reserves lazily (node) really allocates it.
                "buffer": "new Uint8Array(2 ** 32).fill(1).length",
                "recursion": "function f(n) { return f(n + 1) + 1 } f(0)",
            },
            _PY: {
                "strings": "a = []\nwhile True: a.append('x' * (1 << 20) + str(len(a)))",
                "arrays": "b = []\nwhile True: b.append(bytearray(1 << 18))",
                "buffer": "bytearray(2 ** 50)",
                "recursion": "def f(n):\n    return f(n + 1) + 1\nf(0)",
            },
        }
        alive = {_JS: "'still here'", _PY: "'still here'"}
        async with h.session("script") as opened:
            script = _runner(opened)
            for lang in _languages(h, script):
                for name, code in bombs[lang].items():
                    started = time.monotonic()
                    result = await _run(h, script, code, 10.0, lang=lang)
                    elapsed = time.monotonic() - started
                    assert result.error is not None or result.timed_out, (
                        f"{lang} {name}: the bomb neither failed nor timed out: {result!r}"
                    )
                    assert elapsed < 10.0 + _SLACK, f"{lang} {name}: took {elapsed:.1f} s"
                after = await _run(h, script, alive[lang], lang=lang)
                assert after.result_json == '"still here"', f"{lang}: the runner broke: {after!r}"

    @rule(ERRORS)
    @pytest.mark.anyio
    async def test_script_errors_carry_name_value_traceback(self, conformance: Harness) -> None:
        """An uncaught error is described by name, value and traceback."""
        h = conformance
        h.require("script")
        failing = {
            _JS: ("function deep() { throw new RangeError('out of range') }\ndeep()", "RangeError"),
            _PY: ("def deep():\n    raise ValueError('out of range')\ndeep()", "ValueError"),
        }
        async with h.session("script") as opened:
            script = _runner(opened)
            for lang in _languages(h, script):
                code, name = failing[lang]
                result = await _run(h, script, code, lang=lang)
                assert result.exit_code == 1, (
                    f"{lang}: an uncaught error has exit_code {result.exit_code!r}"
                )
                assert result.error is not None, f"{lang}: no error reported: {result!r}"
                assert result.error.name == name, f"{lang}: error name {result.error.name!r}"
                assert result.error.value == "out of range", (
                    f"{lang}: error value {result.error.value!r}"
                )
                head = f"{name}: out of range"
                shown = (
                    result.error.traceback.startswith(head)
                    if lang == _JS
                    else result.error.traceback.rstrip("\n").endswith(head)
                )
                assert shown, f"{lang}: traceback {result.error.traceback!r}"
                assert result.result_json is None, f"{lang}: a failed script also reported a result"

    @rule(CONSOLE)
    @pytest.mark.anyio
    async def test_script_console_is_captured(self, conformance: Harness) -> None:
        """console.log / print to stdout, console.error / print to stderr."""
        h = conformance
        h.require("script")
        printing = {
            _JS: "console.log('one'); console.error('two'); console.log('three', 4)",
            _PY: "import sys\nprint('one')\nprint('two', file=sys.stderr)\nprint('three', 4)",
        }
        async with h.session("script") as opened:
            script = _runner(opened)
            for lang in _languages(h, script):
                result = await _run(h, script, printing[lang], lang=lang)
                assert result.exit_code == 0, f"{lang}: {result!r}"
                assert result.stdout == "one\nthree 4\n", f"{lang}: stdout was {result.stdout!r}"
                assert result.stderr == "two\n", f"{lang}: stderr was {result.stderr!r}"
                assert not result.stdout_truncated, f"{lang}: small stdout marked truncated"

    @rule(RESULT)
    @pytest.mark.anyio
    async def test_script_result_is_the_last_expression(self, conformance: Harness) -> None:
        """The last expression's value comes back as JSON; a promise is awaited."""
        h = conformance
        h.require("script")
        cases: dict[str, dict[str, object]] = {
            _JS: {
                "const x = {a: [1, 'b', null]}; x": {"a": [1, "b", None]},
                "Promise.resolve(6).then(v => v * 7)": 42,
                "'text'": "text",
            },
            _PY: {
                "x = {'a': [1, 'b', None]}\nx": {"a": [1, "b", None]},
                "async def f():\n    return 6 * 7\nf()": 42,
                "'text'": "text",
            },
        }
        nothing_for = {_JS: "undefined", _PY: "None"}
        async with h.session("script") as opened:
            script = _runner(opened)
            for lang in _languages(h, script):
                for code, want in cases[lang].items():
                    result = await _run(h, script, code, lang=lang)
                    assert result.exit_code == 0, f"{lang} {code!r}: {result!r}"
                    assert result.result_json is not None, f"{lang} {code!r}: no result"
                    assert json.loads(result.result_json) == want, (
                        f"{lang} {code!r}: result {result.result_json!r}"
                    )
                nothing = await _run(h, script, nothing_for[lang], lang=lang)
                assert nothing.result_json is None, (
                    f"{lang}: {nothing_for[lang]} gave {nothing.result_json!r}"
                )

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
