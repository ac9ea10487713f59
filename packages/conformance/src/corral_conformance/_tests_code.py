"""The ``code`` module (where advertised): stateful Python contexts, told truthfully.

Python is the language every code provider must have; the rules run Python
cells. Timing rules use short timeouts and generous slack so a loaded CI
machine does not make them flaky.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Final

import anyio
import pytest

from corral import ExecResult, OperationError
from corral.provider import CodeInterpreter

from ._harness import Harness
from ._rules import define, rule

__all__ = ["AbstractCodeTests"]

_P = "CodeInterpreter"
_R = "corral._data.ExecResult"
STATE_KEPT = define(
    "code.state.kept",
    _P,
    "Variables, imports and functions defined by a run in a context are there for the "
    "next run in it; each such run reports state='kept'.",
)
STATE_ISOLATED = define(
    "code.state.isolated",
    _P,
    "Contexts share nothing: a variable set in one context is undefined in another of the "
    "same workspace and in a context of another session.",
)
FRESH = define(
    "code.run_code.fresh",
    "CodeInterpreter.run_code",
    "run_code runs in a fresh interpreter: nothing from an earlier run_code is visible, and "
    "the result says state='fresh'.",
)
ERRORS = define(
    "code.errors.fields",
    _R,
    "An uncaught error is a result, not an exception: exit_code 1, error with the error's "
    "class name, its message as value and a traceback naming the failing line; the "
    "context keeps its state.",
)
RESULT = define(
    "code.result.value",
    _R,
    "The value of a cell's last expression comes back as result_json (its JSON text, None "
    "without a JSON form) and as a 'result' output whose text/plain is its repr; printed "
    "text is in stdout and stderr, each in its own stream.",
)
TIMEOUT_INTERRUPT = define(
    "code.timeout.interrupt",
    _P,
    "On timeout the interpreter is interrupted first: a cell that honours the interrupt "
    "returns timed_out=True, exit_code None and state='kept', and the context's variables "
    "survive.",
)
TIMEOUT_KILL = define(
    "code.timeout.kill",
    _P,
    "A cell that ignores the interrupt is killed: the result says state='lost' (never "
    "'kept'), and the run returns soon after its timeout.",
)
LOST = define(
    "code.lost.reported",
    _P,
    "A context whose interpreter died is never silently replaced: every later call on it "
    "raises OperationError(code='lost') until it is deleted; delete works on it.",
)
BUSY = define(
    "code.busy.one_at_a_time",
    _P,
    "One execution per context at a time: a second call on a busy context either waits for "
    "the first to finish or raises OperationError(code='busy'); two cells never overlap.",
)
LANGUAGES = define(
    "code.language.available",
    _P,
    "languages includes 'python'; a language the workspace lacks is an OperationError "
    "naming the available languages.",
)
UNKNOWN = define(
    "code.context.unknown",
    _P,
    "An id that names no context of this workspace (never created, deleted, or another "
    "session's) is OperationError(code='not_found').",
)

_PY: Final = "python"
_RUN_S: Final = 30.0
_SLACK_S: Final = 15.0
"""How far past its timeout a stopped cell may return, at most (a loaded CI machine)."""


def _code(opened: Any) -> CodeInterpreter:
    code = opened.workspace.code
    assert code is not None
    return code  # type: ignore[no-any-return]


async def _run(
    h: Harness, code: CodeInterpreter, ctx: str, cell: str, timeout_s: float = _RUN_S
) -> ExecResult:
    return await h.call(code.run_in_context, ctx, cell, timeout_s=timeout_s)


async def _value(h: Harness, code: CodeInterpreter, ctx: str, cell: str) -> Any:
    result = await _run(h, code, ctx, cell)
    assert result.error is None, f"the cell failed: {result.error!r}"
    assert result.result_json is not None, f"the cell returned no JSON value: {result!r}"
    return json.loads(result.result_json)


async def _context(h: Harness, code: CodeInterpreter) -> str:
    if _PY not in code.languages:
        pytest.fail(f"provider {h.kind} advertises code without python: {sorted(code.languages)}")
    return await h.call(code.create_context, _PY)


class AbstractCodeTests:
    """The ``code`` rules for providers that advertise it."""

    @rule(STATE_KEPT)
    @pytest.mark.anyio
    async def test_code_state_is_kept_within_a_context(self, conformance: Harness) -> None:
        """Names defined by one cell are there in the next."""
        h = conformance
        h.require("code")
        async with h.session("code") as opened:
            code = _code(opened)
            ctx = await _context(h, code)
            first = await _run(
                h, code, ctx, "import math\nbase = 40\ndef add(x):\n    return base + x"
            )
            assert first.error is None, f"first cell: {first!r}"
            assert first.state == "kept", f"first cell: {first!r}"
            second = await _run(h, code, ctx, "add(2) + int(math.sqrt(0))")
            assert second.state == "kept", f"state={second.state!r} after an ordinary cell"
            assert second.result_json == "42", f"the context forgot its names: {second!r}"

    @rule(STATE_ISOLATED)
    @pytest.mark.anyio
    async def test_code_contexts_share_nothing(self, conformance: Harness) -> None:
        """Another context, and another session's context, never see a variable."""
        h = conformance
        h.require("code")
        name = f"secret_{secrets.token_hex(4)}"
        probe = f"'{name}' in globals()"
        async with h.session("code") as opened, h.session("code") as other_session:
            code = _code(opened)
            a, b = await _context(h, code), await _context(h, code)
            await _value(h, code, a, f"{name} = 1\n{probe}")
            assert await _value(h, code, b, probe) is False, "a variable leaked to another context"
            other = _code(other_session)
            c = await _context(h, other)
            assert await _value(h, other, c, probe) is False, "a variable leaked across sessions"

    @rule(FRESH)
    @pytest.mark.anyio
    async def test_code_run_code_starts_fresh(self, conformance: Harness) -> None:
        """run_code keeps nothing between calls."""
        h = conformance
        h.require("code")
        async with h.session("code") as opened:
            code = _code(opened)
            first = await h.call(code.run_code, _PY, "leftover = 1\nleftover", timeout_s=_RUN_S)
            assert first.result_json == "1", f"run_code failed: {first!r}"
            assert first.state == "fresh", f"run_code reported state={first.state!r}"
            second = await h.call(code.run_code, _PY, "'leftover' in globals()", timeout_s=_RUN_S)
            assert second.result_json == "false", "run_code saw an earlier run's variable"

    @rule(ERRORS)
    @pytest.mark.anyio
    async def test_code_errors_carry_name_value_traceback(self, conformance: Harness) -> None:
        """A raised error is a result with its fields; the context lives on."""
        h = conformance
        h.require("code")
        async with h.session("code") as opened:
            code = _code(opened)
            ctx = await _context(h, code)
            await _run(h, code, ctx, "kept = 'yes'")
            cell = "def explode():\n    raise KeyError('the-missing-key')\n\nexplode()"
            result = await _run(h, code, ctx, cell)
            assert result.exit_code == 1, f"exit_code {result.exit_code!r} for an error"
            assert result.error is not None, f"no error reported: {result!r}"
            assert result.error.name == "KeyError", f"error name {result.error.name!r}"
            assert "the-missing-key" in result.error.value, f"value {result.error.value!r}"
            assert "raise KeyError" in result.error.traceback, "the traceback lacks the line"
            assert result.state == "kept", f"state={result.state!r} after an ordinary error"
            assert await _value(h, code, ctx, "kept") == "yes", (
                "an error cost the context its state"
            )

    @rule(RESULT)
    @pytest.mark.anyio
    async def test_code_result_and_streams(self, conformance: Harness) -> None:
        """Last expression as JSON and as a result bundle; stdout and stderr apart."""
        h = conformance
        h.require("code")
        async with h.session("code") as opened:
            code = _code(opened)
            ctx = await _context(h, code)
            cell = "import sys\nprint('to out')\nprint('to err', file=sys.stderr)\n{'k': [1, 2]}"
            result = await _run(h, code, ctx, cell)
            assert result.exit_code == 0, f"the cell failed: {result!r}"
            assert result.error is None, f"the cell failed: {result!r}"
            assert json.loads(result.result_json or "null") == {"k": [1, 2]}, result.result_json
            assert "to out" in result.stdout, result.stdout
            assert "to err" not in result.stdout, result.stdout
            assert "to err" in result.stderr, result.stderr
            shown = [o for o in result.outputs if o.kind == "result"]
            assert shown, result.outputs
            assert shown[-1].data.get("text/plain") == "{'k': [1, 2]}", result.outputs
            opaque = await _run(h, code, ctx, "object()")
            assert opaque.result_json is None, "a value without a JSON form got result_json"
            nothing = await _run(h, code, ctx, "x = 1")
            assert nothing.result_json is None, "a cell ending in an assignment reported a value"
            assert not [o for o in nothing.outputs if o.kind == "result"], (
                "a cell ending in an assignment reported a value"
            )

    @rule(TIMEOUT_INTERRUPT)
    @pytest.mark.anyio
    async def test_code_timeout_interrupts_and_keeps_state(self, conformance: Harness) -> None:
        """A loop that honours KeyboardInterrupt stops at the timeout; variables survive."""
        h = conformance
        h.require("code")
        async with h.session("code") as opened:
            code = _code(opened)
            ctx = await _context(h, code)
            await _run(h, code, ctx, "survivor = 'alive'")
            with anyio.fail_after(1.0 + _SLACK_S):
                result = await code.run_in_context(
                    ctx, "import time\nwhile True:\n    time.sleep(0.01)", timeout_s=1.0
                )
            assert result.timed_out, f"a cell past its timeout did not time out: {result!r}"
            assert result.exit_code is None, f"exit_code {result.exit_code!r} after a timeout"
            assert result.state == "kept", f"state={result.state!r}: the interrupt was not tried"
            assert await _value(h, code, ctx, "survivor") == "alive", "the state did not survive"

    @rule(TIMEOUT_KILL)
    @pytest.mark.anyio
    async def test_code_ignored_interrupt_is_reported_lost(self, conformance: Harness) -> None:
        """A cell that ignores SIGINT is killed and the result says the state is gone."""
        h = conformance
        h.require("code")
        async with h.session("code") as opened:
            code = _code(opened)
            ctx = await _context(h, code)
            stubborn = (
                "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "while True:\n    time.sleep(0.01)"
            )
            with anyio.fail_after(1.0 + _SLACK_S):
                result = await code.run_in_context(ctx, stubborn, timeout_s=1.0)
            assert result.timed_out, f"no timeout reported: {result!r}"
            assert result.state == "lost", (
                f"state={result.state!r} for an interpreter that had to be killed"
            )

    @rule(LOST)
    @pytest.mark.anyio
    async def test_code_dead_context_is_lost_not_replaced(self, conformance: Harness) -> None:
        """After the interpreter kills itself, every call says lost; delete still works."""
        h = conformance
        h.require("code")
        async with h.session("code") as opened:
            code = _code(opened)
            ctx = await _context(h, code)
            await _run(h, code, ctx, "precious = 1")
            died = await _run(
                h, code, ctx, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"
            )
            assert died.state == "lost", f"state={died.state!r} for an interpreter that died"
            for attempt in range(2):
                with pytest.raises(OperationError) as caught:
                    await _run(h, code, ctx, "precious")
                assert caught.value.code == "lost", (
                    f"call {attempt + 1} on a dead context: {caught.value.code!r}"
                )
            await h.call(code.delete_context, ctx)
            with pytest.raises(OperationError) as gone:
                await _run(h, code, ctx, "1")
            assert gone.value.code == "not_found", f"after delete: {gone.value.code!r}"

    @rule(BUSY)
    @pytest.mark.anyio
    async def test_code_one_cell_per_context(self, conformance: Harness) -> None:
        """A second cell on a busy context waits or is refused; the two never overlap."""
        h = conformance
        h.require("code")
        async with h.session("code") as opened:
            code = _code(opened)
            ctx = await _context(h, code)
            await _run(h, code, ctx, "import time\nspans = []")
            slow = "t0 = time.monotonic()\ntime.sleep(1.0)\nspans.append((t0, time.monotonic()))"
            quick = "t0 = time.monotonic()\nspans.append((t0, time.monotonic()))"
            outcomes: list[object] = []

            async def second() -> None:
                await anyio.sleep(0.3)
                try:
                    outcomes.append(await _run(h, code, ctx, quick))
                except OperationError as exc:
                    outcomes.append(exc.code)

            async with anyio.create_task_group() as tg:
                tg.start_soon(second)
                first = await _run(h, code, ctx, slow)
            assert first.error is None, f"the slow cell failed: {first!r}"
            [outcome] = outcomes
            if outcome == "busy":
                return
            assert isinstance(outcome, ExecResult), f"the second call failed: {outcome!r}"
            spans = await _value(h, code, ctx, "spans")
            assert len(spans) == 2, spans
            (_, end_slow), (start_quick, _) = sorted(spans)
            assert start_quick >= end_slow, "two cells ran in one context at the same time"

    @rule(LANGUAGES)
    @pytest.mark.anyio
    async def test_code_languages_are_real(self, conformance: Harness) -> None:
        """python is there; another language's refusal names the available ones."""
        h = conformance
        h.require("code")
        async with h.session("code") as opened:
            code = _code(opened)
            assert _PY in code.languages, f"languages {sorted(code.languages)} lack python"
            with pytest.raises(OperationError) as caught:
                await h.call(code.create_context, "brainfudge")
            assert _PY in caught.value.message, (
                f"refusal names no language: {caught.value.message!r}"
            )
            with pytest.raises(OperationError) as again:
                await h.call(code.run_code, "brainfudge", "+", timeout_s=_RUN_S)
            assert _PY in again.value.message, f"refusal names no language: {again.value.message!r}"

    @rule(UNKNOWN)
    @pytest.mark.anyio
    async def test_code_unknown_context_is_not_found(self, conformance: Harness) -> None:
        """Made-up ids and another session's ids are not_found."""
        h = conformance
        h.require("code")
        async with h.session("code") as opened, h.session("code") as other_session:
            code, other = _code(opened), _code(other_session)
            foreign = await _context(h, other)
            for ctx in ("no-such-context", foreign):
                with pytest.raises(OperationError) as caught:
                    await _run(h, code, ctx, "1")
                assert caught.value.code == "not_found", f"{caught.value.code!r} for {ctx!r}"
