"""BoxScriptRunner: how a box's report becomes a script result, for every box provider."""

from __future__ import annotations

import pytest

from corral.provider import ExecError, ExecResult
from corral_posix._scriptbox import BoxRun, BoxScriptRunner, frame_cap
from corral_posix._scriptdriver import ScriptFrame, make_program

pytestmark = pytest.mark.anyio


class _Canned(BoxScriptRunner):
    """A box that reports what the test says, after building the real program."""

    def __init__(self, run: BoxRun, **options: object) -> None:
        super().__init__(
            frozenset({"python"}),
            box="canned",
            missing="none",
            memory_bytes=256,
            sigkill_note=" (the limit, most likely)",
            **options,  # type: ignore[arg-type]
        )
        self.run = run
        self.programs: list[bytes] = []

    async def _run_box(self, language: str, code: str, timeout_s: float) -> BoxRun:
        self.programs.append(self._program(language, code, channel_fd=7).marker)
        return self.run


async def _result(result: ExecResult, frame: ScriptFrame | None, oom: bool = False) -> ExecResult:
    return await _Canned(BoxRun(result, frame, oom=oom)).run_code("python", "1", timeout_s=5)


async def test_a_frame_gives_the_result_or_the_error() -> None:
    ok = await _result(ExecResult(exit_code=0, stdout="hi\n"), ScriptFrame("42", None))
    assert (ok.exit_code, ok.result_json, ok.error, ok.stdout, ok.state) == (
        0,
        "42",
        None,
        "hi\n",
        "fresh",
    )
    err = ExecError("ValueError", "bad", "ValueError: bad\n")
    failed = await _result(ExecResult(exit_code=1), ScriptFrame(None, err))
    assert (failed.exit_code, failed.error) == (1, err)


async def test_a_timeout_has_no_exit_code_whatever_the_frame() -> None:
    result = await _result(ExecResult(exit_code=137, timed_out=True), ScriptFrame("1", None))
    assert result.timed_out
    assert result.exit_code is None
    assert result.result_json is None


async def test_out_of_memory_beats_a_frame_and_names_the_limit() -> None:
    result = await _result(ExecResult(exit_code=None, signal=9), ScriptFrame("1", None), oom=True)
    assert result.error is not None
    assert result.error.name == "MemoryError"
    assert "256 bytes" in result.error.value
    assert result.result_json is None


async def test_a_killed_interpreter_names_its_signal_and_the_likely_cause() -> None:
    killed = await _result(ExecResult(exit_code=None, signal=9), None)
    assert killed.error is not None
    assert killed.error.name == "Killed"
    assert killed.error.value.endswith("signal 9 (the limit, most likely)")
    other = await _result(ExecResult(exit_code=None, signal=15), None)
    assert other.error is not None
    assert other.error.value.endswith("signal 15")


@pytest.mark.parametrize(("status", "reported"), [(0, 1), (None, 1), (3, 3)])
async def test_an_interpreter_that_ended_without_a_frame_is_an_error(
    status: int | None, reported: int
) -> None:
    result = await _result(ExecResult(exit_code=status), None)
    assert result.exit_code == reported
    assert result.error is not None
    assert result.error.name == "InterpreterError"


async def test_each_call_gets_a_fresh_marker_and_details_describe_the_box() -> None:
    runner = _Canned(BoxRun(ExecResult(exit_code=0), None), max_output_bytes=10)
    await runner.run_code("python", "1", timeout_s=1)
    await runner.run_code("python", "1", timeout_s=1)
    assert len(set(runner.programs)) == 2
    assert runner.details() == {
        "script_languages": ["python"],
        "script_box": "canned",
        "script_max_timeout_s": 60.0,
        "script_max_output_bytes": 10,
    }


def test_the_frame_cap_holds_a_frame_of_a_capped_result() -> None:
    cap = 1000
    program = make_program("python", "1", channel_fd=3, result_cap=cap)
    # The worst case: every byte of the result escaped in the frame's JSON.
    worst = len(program.marker) + len('{"result": "", "error": null}\n') + 6 * cap
    assert frame_cap(cap) >= worst
