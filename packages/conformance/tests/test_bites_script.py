"""Proof that the script rules bite: one realistic defect per rule, around the isolate provider.

Each broken provider is corral-isolate with ONE defect a script-runner author
could plausibly ship (a shared interpreter, a runner that reads files for the
script, a timeout that waits instead of stopping...). Each case runs the
script rules through ``check_provider`` and asserts that the intended rules
fail and that no other script rule does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

import corral
import corral.provider
from corral import ExecError, ExecResult, OperationError, ProviderConfig, SessionRef, WorkspaceRef
from corral.provider import OpenedWorkspace
from corral_conformance import check_provider

pytest.importorskip("corral_isolate", reason="corral-isolate is not installed")

SCRIPT_RULES = ("script",)
Run = Callable[[Any, str, str, float], Awaitable[ExecResult]]


class _Runner:
    """The isolate's runner with one defect in how it runs code or reports results."""

    def __init__(self, inner: Any, run: Run) -> None:
        self._inner = inner
        self._run = run

    @property
    def languages(self) -> frozenset[str]:
        return self._inner.languages  # type: ignore[no-any-return]

    async def run_code(self, language: str, code: str, *, timeout_s: float) -> ExecResult:
        return await self._run(self._inner, language, code, timeout_s)


class _BrokenScriptProvider:
    """corral-isolate with its script runner wrapped; everything else forwarded."""

    def __init__(self, run: Run) -> None:
        from corral_isolate import IsolateProvider

        self._inner = IsolateProvider()
        self._run = run

    provider_id = property(lambda self: self._inner.provider_id)
    capabilities = property(lambda self: self._inner.capabilities)
    schema_version = property(lambda self: self._inner.schema_version)

    def _wrap(self, ws: Any) -> corral.provider.ModularWorkspace:
        return corral.provider.ModularWorkspace(
            ws.id, script=_Runner(ws.script, self._run), on_close=ws.close, details=ws.details
        )

    async def open(
        self, config: ProviderConfig, session: SessionRef, declared: frozenset[str] | None = None
    ) -> OpenedWorkspace:
        opened = await self._inner.open(config, session, declared)
        return OpenedWorkspace(workspace=self._wrap(opened.workspace), ref=opened.ref)

    async def resolve(self, ref: WorkspaceRef) -> corral.provider.ModularWorkspace:
        return self._wrap(await self._inner.resolve(ref))


_HISTORY: dict[int, list[str]] = {}


async def _shared_interpreter(inner: Any, language: str, code: str, timeout: float) -> ExecResult:
    """One long-lived interpreter per workspace: earlier successful scripts' state persists.

    Emulated by silently replaying this workspace's earlier successful scripts first.
    """
    history = _HISTORY.setdefault(id(inner), [])
    replay = "".join(
        "{ const c = globalThis.console; globalThis.console = {log() {}, error() {}};"
        f" try {{ (0, eval)({json.dumps(old)}) }} catch {{}} globalThis.console = c; }}\n"
        for old in history
    )
    result: ExecResult = await inner.run_code(language, replay + code, timeout_s=timeout)
    if result.exit_code == 0:
        history.append(code)
    return result


async def _files_for_the_script(inner: Any, language: str, code: str, timeout: float) -> ExecResult:
    """A helpful host that serves readFileSync and loadFile from the real disk."""
    result: ExecResult = await inner.run_code(language, code, timeout_s=timeout)
    for path in {p for p in json.loads(json.dumps(code)).split('"') if p.startswith("/")}:
        if Path(path).is_file():
            text = Path(path).read_text(errors="replace")
            return attrs.evolve(result, result_json=json.dumps(text), error=None, exit_code=0)
    return result


async def _network_for_the_script(
    inner: Any, language: str, code: str, timeout: float
) -> ExecResult:
    """A host that performs fetch() on the script's behalf."""
    if "fetch(" in code:
        url = code.split("fetch(", 1)[1].split(")", 1)[0].strip("\"'")
        host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
        with anyio.fail_after(5):
            stream = await anyio.connect_tcp(host, int(port))
            await stream.aclose()
    return await inner.run_code(language, code, timeout_s=timeout)  # type: ignore[no-any-return]


async def _waits_out_loops(inner: Any, language: str, code: str, timeout: float) -> ExecResult:
    """A timeout reported as an ordinary error instead of timed_out."""
    result: ExecResult = await inner.run_code(language, code, timeout_s=timeout)
    if result.timed_out:
        return attrs.evolve(
            result, timed_out=False, exit_code=1, error=ExecError("Error", "took too long")
        )
    return result


async def _bombs_hang(inner: Any, language: str, code: str, timeout: float) -> ExecResult:
    """No memory cap: an allocation bomb is reported as a success that produced nothing."""
    result: ExecResult = await inner.run_code(language, code, timeout_s=timeout)
    if result.error is not None and result.error.name == "InternalError":
        return attrs.evolve(result, error=None, exit_code=0)
    return result


async def _error_as_stderr(inner: Any, language: str, code: str, timeout: float) -> ExecResult:
    """Errors printed to stderr only, as a plain subprocess runner would."""
    result: ExecResult = await inner.run_code(language, code, timeout_s=timeout)
    if result.error is not None:
        return attrs.evolve(result, error=None, stderr=result.stderr + result.error.traceback)
    return result


async def _console_merged(inner: Any, language: str, code: str, timeout: float) -> ExecResult:
    """console.error folded into stdout."""
    result: ExecResult = await inner.run_code(language, code, timeout_s=timeout)
    return attrs.evolve(result, stdout=result.stdout + result.stderr, stderr="")


async def _result_as_text(inner: Any, language: str, code: str, timeout: float) -> ExecResult:
    """Objects rendered with String() rather than JSON (``[object Object]``)."""
    result: ExecResult = await inner.run_code(language, code, timeout_s=timeout)
    if result.result_json is not None and result.result_json.startswith("{"):
        return attrs.evolve(result, result_json=json.dumps("[object Object]"))
    return result


async def _bare_language_error(inner: Any, language: str, code: str, timeout: float) -> ExecResult:
    """Refuses an unknown language without saying which ones exist."""
    if language not in inner.languages:
        raise OperationError("unsupported language", code="invalid_argument")
    return await inner.run_code(language, code, timeout_s=timeout)  # type: ignore[no-any-return]


_CASES: list[tuple[Run, tuple[str, ...]]] = [
    (_shared_interpreter, ("script_keeps_no_state",)),
    (_files_for_the_script, ("script_sees_no_files",)),
    (_network_for_the_script, ("script_reaches_no_network",)),
    (_waits_out_loops, ("script_infinite_loop_is_stopped",)),
    (_bombs_hang, ("script_bombs_end_within_budget",)),
    # Bombs are reported through error too, so their rule sees the defect as well.
    (
        _error_as_stderr,
        ("script_errors_carry_name_value_traceback", "script_bombs_end_within_budget"),
    ),
    (_console_merged, ("script_console_is_captured",)),
    (_result_as_text, ("script_result_is_the_last_expression",)),
    (_bare_language_error, ("script_unknown_language_lists_available",)),
]


@pytest.mark.parametrize(("run", "intended"), _CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_script_defect_fails_its_rule(run: Run, intended: tuple[str, ...], tmp_path: Path) -> None:
    # Checked in a fresh interpreter whose temp dir has the letters the rules use as
    # placeholders in their code templates: CI's ``mktemp -d`` names hold them about
    # one time in seven, and the secret's path was once filled in twice and mangled,
    # so the file rule could not see a host file being read.
    script = (
        "import json, sys, test_bites_script as b\n"
        "from corral_conformance import check_provider\n"
        f"run = getattr(b, {run.__name__!r})\n"
        "r = check_provider(lambda: b._BrokenScriptProvider(run), rules=b.SCRIPT_RULES, "
        "shrink=False)\n"
        f"print(json.dumps([{{n: [r.result(n).status, r.result(n).reason] for n in {intended!r}}}, "
        "[x.rule for x in r.failed]]))"
    )
    (tmp_path / "tmp.PW").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
        env={
            **os.environ,
            "PYTHONPATH": str(Path(__file__).parent),
            "TMPDIR": str((tmp_path / "tmp.PW").resolve()),
        },
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    statuses, failed_rules = json.loads(done.stdout.strip().splitlines()[-1])
    for name in intended:
        status, reason = statuses[name]
        assert status == "fail", f"{name} did not catch the defect: {status}"
        assert reason, f"{name} failed without a reason"
    failed = set(failed_rules)
    extra = failed - set(intended)
    assert not extra, f"expected exactly {sorted(intended)} to fail, also failed: {sorted(extra)}"


def test_the_unbroken_isolate_passes_every_script_rule() -> None:
    async def honest(inner: Any, language: str, code: str, timeout: float) -> ExecResult:
        return await inner.run_code(language, code, timeout_s=timeout)  # type: ignore[no-any-return]

    report = check_provider(lambda: _BrokenScriptProvider(honest), rules=SCRIPT_RULES)
    assert report.ok, [f"{r.rule}: {r.reason}" for r in report.failed]
    ran = {r.rule for r in report.results if r.status == "pass"}
    assert {name for _, names in _CASES for name in names} <= ran, sorted(ran)
