"""StatelessScriptRunner: the checks every ``script`` module makes before it runs anything."""

from __future__ import annotations

import math

import pytest

from corral.provider import CodeInterpreter, ExecResult, OperationError, StatelessScriptRunner

pytestmark = pytest.mark.anyio


class _Echo(StatelessScriptRunner):
    """Records what reached the subclass: only checked calls may."""

    def __init__(self) -> None:
        super().__init__(frozenset({"python"}), max_timeout_s=5.0, missing="none: no python3")
        self.calls: list[tuple[str, str, float]] = []

    async def _run_script(self, language: str, code: str, timeout_s: float) -> ExecResult:
        self.calls.append((language, code, timeout_s))
        return ExecResult(exit_code=0, state="fresh")


def test_a_runner_is_a_code_interpreter() -> None:
    assert isinstance(_Echo(), CodeInterpreter)


async def test_the_timeout_is_clamped_to_the_ceiling() -> None:
    runner = _Echo()
    await runner.run_code("python", "1", timeout_s=60)
    await runner.run_code("python", "2", timeout_s=1)
    assert runner.calls == [("python", "1", 5.0), ("python", "2", 1.0)]


@pytest.mark.parametrize("timeout", [0, -1, math.inf, math.nan, True])
async def test_a_bad_timeout_is_refused_before_running(timeout: float) -> None:
    runner = _Echo()
    with pytest.raises(OperationError) as info:
        await runner.run_code("python", "1", timeout_s=timeout)
    assert info.value.code == "invalid_argument"
    assert runner.calls == []


async def test_an_unknown_language_names_the_available_ones_and_never_echoes_junk() -> None:
    runner = _Echo()
    with pytest.raises(OperationError) as info:
        await runner.run_code("ruby", "1", timeout_s=1)
    assert info.value.code == "invalid_argument"
    assert "'ruby'" in info.value.message
    assert "python" in info.value.message
    junk = "x\n" * 100
    with pytest.raises(OperationError) as junked:
        await runner.run_code(junk, "1", timeout_s=1)
    assert junk not in junked.value.message
    assert runner.calls == []


async def test_an_empty_runner_says_why() -> None:
    runner = _Echo()
    runner._languages = frozenset()
    with pytest.raises(OperationError) as info:
        await runner.run_code("python", "1", timeout_s=1)
    assert "none: no python3" in info.value.message


async def test_a_closed_runner_and_every_context_call_refuse() -> None:
    runner = _Echo()
    for call in (
        runner.create_context("python"),
        runner.run_in_context("c", "1", timeout_s=1),
        runner.delete_context("c"),
    ):
        with pytest.raises(OperationError) as info:
            await call
        assert info.value.code == "unsupported"
    runner.close()
    with pytest.raises(OperationError) as closed:
        await runner.run_code("python", "1", timeout_s=1)
    assert closed.value.code == "closed"
    assert runner.calls == []
