"""The 30-second example: a scripted LLM drives the workspace tools.

No model and no API key: :class:`ScriptedLLM` plays the mock LLM's role,
answering each turn with tool calls fixed in advance (some computed from
earlier results, as a model would read a snapshot id back). The loop is the
same one a real agent runs: ask the model, execute its tool calls, feed the
results back, stop when it answers with text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ._plugins import PluginSet
from ._session import open_workspace
from ._tool import ToolResult

__all__ = ["ScriptedLLM", "ToolCall", "run_agent", "run_demo"]


@attrs.frozen
class ToolCall:
    """One tool call the model asks for."""

    id: str
    name: str
    arguments: dict[str, Any]


Turn = Callable[[list[ToolResult]], Sequence[ToolCall] | str]


class ScriptedLLM:
    """Answers each turn from a fixed script; a turn sees every earlier result."""

    def __init__(self, turns: Sequence[Turn]) -> None:
        self._turns = list(turns)
        self._history: list[ToolResult] = []

    def next_turn(self, last_results: Sequence[ToolResult]) -> Sequence[ToolCall] | str:
        """The model's next answer: tool calls, or final text."""
        self._history.extend(last_results)
        if not self._turns:
            return "Done."
        return self._turns.pop(0)(self._history)


async def run_agent(
    llm: ScriptedLLM,
    call_tool: Callable[[str, dict[str, Any]], Any],
    *,
    echo: Callable[[str], None] = print,
    max_steps: int = 50,
) -> str:
    """Drive a model until it answers with text; return ``completed`` or ``max_steps``."""
    results: list[ToolResult] = []
    for _ in range(max_steps):
        answer = llm.next_turn(results)
        if isinstance(answer, str):
            echo(f"assistant: {answer}")
            return "completed"
        results = []
        for call in answer:
            echo(f"→ {call.name} {json.dumps(call.arguments, ensure_ascii=False)}")
            result: ToolResult = await call_tool(call.name, call.arguments)
            shown = result.content if len(result.content) <= 400 else result.content[:400] + " …"
            marker = "✗" if result.is_error else "←"
            echo("  " + f"{marker} " + shown.replace("\n", "\n    "))
            results.append(result)
    return "max_steps"


def _one(name: str, **arguments: Any) -> Turn:
    return lambda _history: [ToolCall(f"t-{name}", name, arguments)]


def _restore_last_snapshot(history: list[ToolResult]) -> list[ToolCall]:
    snapshot_id = next(
        r.data["snapshot_id"] for r in reversed(history) if r.data and "snapshot_id" in r.data
    )
    return [ToolCall("t-restore", "workspace_restore", {"snapshot_id": snapshot_id})]


def demo_script(with_shell: bool) -> list[Turn]:
    """The demo's turns: write, read, edit, list, grep, snapshot, change, restore, read."""
    turns: list[Turn] = [
        _one("workspace_write_file", path="/poem.txt", content="roses are red\nviolets are blue\n"),
        _one("workspace_read_file", path="/poem.txt"),
        _one(
            "workspace_edit_file",
            path="/poem.txt",
            old_text="blue",
            new_text="blue\ncorral keeps files safe for you",
        ),
        _one("workspace_ls", path="/"),
        _one("workspace_grep", pattern="r[a-z]+s", path="/"),
        _one("workspace_snapshot", label="before-vandalism"),
        _one("workspace_write_file", path="/poem.txt", content="(the poem was overwritten)\n"),
        _one("workspace_read_file", path="/poem.txt"),
        _restore_last_snapshot,
        _one("workspace_read_file", path="/poem.txt"),
    ]
    if with_shell:
        turns.append(_one("workspace_run", command="wc -l poem.txt"))
    turns.append(lambda _h: "The poem is written, edited, and safe.")
    return turns


async def run_demo(kind: str, plugins: PluginSet, *, echo: Callable[[str], None] = print) -> int:
    """Play the scripted session on a provider kind; 0 when the agent completed."""
    spec = plugins.provider(kind)
    capabilities: dict[str, Any] = {"fs": True, "snapshot": True}
    if "shell" in spec.capabilities:
        capabilities["shell"] = True
    echo(f"provider: {kind} (capabilities: {', '.join(sorted(capabilities))})")
    async with open_workspace(kind, capabilities, session_id="demo", plugins=plugins) as ws:
        llm = ScriptedLLM(demo_script(with_shell="shell" in capabilities))
        status = await run_agent(llm, ws.call, echo=echo)
    echo(f"agent finished: {status}")
    return 0 if status == "completed" else 1
