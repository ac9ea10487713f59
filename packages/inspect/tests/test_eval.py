"""An offline Inspect eval (mockllm) whose model works in a corral sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import TaskState, generate, use_tools
from inspect_ai.tool import bash
from inspect_ai.util import sandbox

from .conftest import provider_config, require


@scorer(metrics=[accuracy()])
def file_written():  # type: ignore[no-untyped-def]  # Inspect's decorator is untyped
    async def score(state: TaskState, target: Target) -> Score:
        content = await sandbox().read_file("answer.txt")
        return Score(value=CORRECT if content.strip() == target.text else INCORRECT)

    return score


@pytest.mark.bwrap
@pytest.mark.slow
# Inspect and its retry library warn about their own deprecations.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
# eval() leaves an anyio stream unclosed (also with Inspect's own "local" sandbox)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_eval_runs_the_models_commands_in_a_corral_workspace(tmp_path: Path) -> None:
    require("local-sandbox")
    outputs = [
        ModelOutput.for_tool_call(
            "mockllm/model", "bash", {"command": "cat numbers.txt | wc -l > answer.txt"}
        ),
        ModelOutput.from_content("mockllm/model", "done"),
    ]
    for output in outputs:  # given usage keeps mockllm from fetching a tokenizer (offline)
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    model = get_model("mockllm/model", custom_outputs=outputs)
    task = Task(
        dataset=[Sample(input="count the lines", target="3", files={"numbers.txt": "1\n2\n3\n"})],
        solver=[use_tools(bash()), generate()],
        scorer=file_written(),
        sandbox=("corral", provider_config("local-sandbox")),  # type: ignore[arg-type]
    )
    [log] = eval(task, model=model, log_dir=str(tmp_path), display="none")
    assert log.status == "success", log.error
    assert log.results is not None
    assert log.results.scores[0].metrics["accuracy"].value == 1.0
    assert log.samples is not None
    tool_results = [m.text for m in log.samples[0].messages if m.role == "tool"]
    assert tool_results == [""]
