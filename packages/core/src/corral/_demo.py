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
            shown_args = json.dumps(call.arguments, ensure_ascii=False)
            if len(shown_args) > 300:
                shown_args = shown_args[:300] + " …"
            echo(f"→ {call.name} {shown_args}")
            result: ToolResult = await call_tool(call.name, call.arguments)
            shown = result.content if len(result.content) <= 400 else result.content[:400] + " …"
            marker = "✗" if result.is_error else "←"
            echo("  " + f"{marker} " + shown.replace("\n", "\n    "))
            for image in result.images:
                size = len(image.data) * 3 // 4
                echo(f"  ← [{image.mime_type}, {size} bytes: reaches the model as image content]")
            results.append(result)
    return "max_steps"


def _one(name: str, **arguments: Any) -> Turn:
    return lambda _history: [ToolCall(f"t-{name}", name, arguments)]


def _restore_last_snapshot(history: list[ToolResult]) -> list[ToolCall]:
    snapshot_id = next(
        r.data["snapshot_id"] for r in reversed(history) if r.data and "snapshot_id" in r.data
    )
    return [ToolCall("t-restore", "workspace_restore", {"snapshot_id": snapshot_id})]


# Draws with matplotlib when the box's python3 has it; otherwise says so and
# draws a small gradient with the standard library, so the image still arrives.
PLOT_CELL = """\
try:
    import matplotlib.pyplot as plt
except ImportError:
    import struct, zlib

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    class Gradient:
        def _repr_png_(self):
            pixels = (bytes(v for x in range(32) for v in (x * 8, y * 8, 160)) for y in range(32))
            rows = b"".join(b"\\0" + row for row in pixels)
            header = struct.pack(">IIBBBBB", 32, 32, 8, 2, 0, 0, 0)
            return (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", header)
                    + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))

    print("matplotlib is not installed for this python3: a stdlib gradient instead")
    display(Gradient())
else:
    xs = list(range(10))
    plt.plot(xs, [x * x for x in xs], marker="o")
    plt.title("squares")
sum(x * x for x in range(10))
"""


def demo_script(with_shell: bool, with_code: bool = False) -> list[Turn]:
    """The demo's turns: write, read, edit, list, grep, snapshot, change, restore, read.

    With ``code``, a last cell draws a plot whose PNG reaches the model as an image.
    """
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
    if with_code:
        turns.append(_one("workspace_run_code", language="python", code=PLOT_CELL))
    turns.append(lambda _h: "The poem is written, edited, and safe.")
    return turns


async def run_demo(kind: str, plugins: PluginSet, *, echo: Callable[[str], None] = print) -> int:
    """Play the scripted session on a provider kind; 0 when the agent completed."""
    spec = plugins.provider(kind)
    capabilities: dict[str, Any] = {"fs": True, "snapshot": True}
    if "shell" in spec.capabilities:
        capabilities["shell"] = True
    if "code" in spec.capabilities:
        capabilities["code"] = True
    echo(f"provider: {kind} (capabilities: {', '.join(sorted(capabilities))})")
    async with open_workspace(kind, capabilities, session_id="demo", plugins=plugins) as ws:
        with_code = "code" in capabilities and "python" in (await ws.workspace()).details().get(
            "code_languages", ["python"]
        )
        llm = ScriptedLLM(demo_script("shell" in capabilities, with_code))
        status = await run_agent(llm, ws.call, echo=echo)
    echo(f"agent finished: {status}")
    return 0 if status == "completed" else 1
