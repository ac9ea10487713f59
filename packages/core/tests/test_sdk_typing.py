"""The README's agent loops and every export pass ``mypy --strict`` against the real SDKs.

corral does not import the OpenAI or Anthropic SDKs; its exports are TypedDict
mirrors of their parameter types. Only a type checker run against the SDKs
proves the mirrors assignable (a TypedDict must declare every key of the
SDK's, with an equivalent type), so this test writes the README's loops and
a file of assignments out and runs mypy on them. It needs no network.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]
README = ROOT / "README.md"

ASSIGNMENTS = """
from __future__ import annotations

from collections.abc import Iterable

import anthropic.types as at
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolUnionParam
from openai.types.responses import ResponseInputItemParam, ToolParam

import corral
import corral.sync


def exports_are_sdk_parameters(
    ws: corral.WorkspaceSession,
    sync_ws: corral.sync.SyncWorkspaceSession,
    tool: corral.Tool,
    block: corral.AnthropicToolResultBlock,
    reply: corral.AnthropicToolResultMessage,
    assistant: corral.OpenAIAssistantMessage,
    tool_messages: list[corral.OpenAIToolMessage],
    outputs: list[corral.OpenAIResponsesFunctionCallOutput],
) -> None:
    chat: Iterable[ChatCompletionToolUnionParam] = ws.openai_tools()
    chat_strict: Iterable[ChatCompletionToolUnionParam] = ws.openai_tools(strict=True)
    one_chat: ChatCompletionToolUnionParam = corral.openai_tool(tool)
    responses: Iterable[ToolParam] = ws.openai_responses_tools()
    one_response: ToolParam = corral.openai_responses_tool(tool, strict=False)
    claude: Iterable[at.ToolUnionParam] = ws.anthropic_tools()
    one_claude: at.ToolUnionParam = corral.anthropic_tool(tool)
    sync_chat: Iterable[ChatCompletionToolUnionParam] = sync_ws.openai_tools()
    sync_responses: Iterable[ToolParam] = sync_ws.openai_responses_tools()
    sync_claude: Iterable[at.ToolUnionParam] = sync_ws.anthropic_tools()
    result_block: at.ToolResultBlockParam = block
    user_turn: at.MessageParam = reply
    assistant_turn: ChatCompletionMessageParam = assistant
    tool_turns: Iterable[ChatCompletionMessageParam] = tool_messages
    response_input: Iterable[ResponseInputItemParam] = outputs
"""


def readme_loops() -> dict[str, str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    loops = {b.splitlines()[0]: b for b in blocks if b.startswith(("# OpenAI", "# Anthropic"))}
    assert set(loops) == {"# OpenAI Chat Completions", "# OpenAI Responses", "# Anthropic Messages"}
    return loops


@pytest.mark.slow
def test_readme_loops_and_exports_pass_mypy_strict_against_the_sdks(tmp_path: Path) -> None:
    files = []
    for i, code in enumerate(readme_loops().values()):
        path = tmp_path / f"readme_loop_{i}.py"
        path.write_text(code)
        files.append(str(path))
    assignments = tmp_path / "sdk_assignments.py"
    assignments.write_text(ASSIGNMENTS)
    files.append(str(assignments))
    # cwd=ROOT: the workspace's mypy configuration (strict, mypy_path) applies.
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
