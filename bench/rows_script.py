"""Row group 7: ``workspace_script("1+1")`` on the isolate vs starting an interpreter."""

from __future__ import annotations

import shutil
import subprocess
import sys

import corral

from _harness import Ctx, Goal, Row, run_pair, skip_reason

CODE = "1+1"


def _baseline() -> tuple[str, list[str]]:
    """``node -e`` when node is installed, else ``python3 -c`` (the issue's two baselines)."""
    node = shutil.which("node")
    if node is not None:
        return "node -e", [node, "-e", CODE]
    python = shutil.which("python3") or sys.executable
    return "python3 -c", [python, "-c", CODE]


def _row(key: str, subject: str, baseline: str) -> Row:
    return Row(
        id=f"script.{key}.isolate",
        group="7 script",
        title='script "1+1"',
        provider="isolate",
        subject=subject,
        baseline=baseline,
        goal=Goal("ratio", 0.1),
    )


def _check(first: corral.ToolResult, runner: object) -> None:
    if first.is_error or first.data.get("result") != 2:
        raise RuntimeError(f"workspace_script gave {first.content[:120]}")
    if runner is None:
        raise RuntimeError("the isolate workspace has no script module")


async def script_rows(ctx: Ctx) -> list[Row]:
    """The tool and the module, each against a fresh interpreter process."""
    name, argv = _baseline()
    tool = _row("tool", "workspace_script", name)
    module = _row("module", "ScriptRunner.run_code", name)

    def spawn() -> None:
        subprocess.run(argv, check=True, capture_output=True)

    try:
        async with corral.open_workspace("isolate", {"script": True}) as ws:
            first = await ws.call("workspace_script", {"code": CODE})
            runner = (await ws.workspace()).script
            _check(first, runner)

            async def call_tool() -> object:
                return await ws.call("workspace_script", {"code": CODE})

            async def call_module() -> object:
                return await runner.run_code("javascript", CODE, timeout_s=5)

            await run_pair(ctx, tool, call_tool, spawn, slow=True)
            await run_pair(ctx, module, call_module, spawn, slow=True)
    except Exception as exc:
        for row in (tool, module):
            row.skipped = row.skipped or skip_reason(exc)
    return [tool, module]
