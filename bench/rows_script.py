"""Row group 7: ``workspace_script("1+1")`` vs starting an interpreter.

The isolate carries the goal (<= 0.1x); local-sandbox (a fresh bubblewrap box
per call) and docker (a fresh container per call, in the code image) are
reported against the same interpreter started bare, with no goal: they pay
for a whole new box each time.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Any

import corral

from _harness import BenchSkip, Ctx, Goal, Row, run_pair, skip_reason
from _providers import precheck

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
    return [tool, module, *[await _box_row(ctx, kind) for kind in ("local-sandbox", "docker")]]


def _box_options(kind: str, ctx: Ctx) -> dict[str, Any]:
    why = precheck(kind)
    if why is not None:
        raise BenchSkip(why)
    if kind != "docker":
        return {"tmpdir_root": str(ctx.tmp)}
    from corral_docker._options import code_image

    return {"image": code_image(), "pull": False, "tmpdir_root": str(ctx.tmp)}


def _box_runner(runner: Any, kind: str, language: str) -> Any:
    if runner is None or language not in runner.languages:
        raise BenchSkip(f"{kind} has no {language} script runner")
    return runner


def _check_box(first: Any, kind: str) -> None:
    if first.result_json != "2":
        raise RuntimeError(f"{kind}: 1+1 gave {first.result_json!r}")


async def _box_row(ctx: Ctx, kind: str) -> Row:
    """``run_code`` in a fresh box of ``kind`` vs the bare interpreter (report only)."""
    name, argv = _baseline()
    language = "javascript" if name == "node -e" else "python"
    row = Row(
        id=f"script.module.{kind}",
        group="7 script",
        title='script "1+1"',
        provider=kind,
        subject="ScriptRunner.run_code",
        baseline=name,
    )

    def spawn() -> None:
        subprocess.run(argv, check=True, capture_output=True)

    try:
        async with corral.open_workspace(
            kind, {"script": True}, provider_options=_box_options(kind, ctx)
        ) as ws:
            runner = _box_runner((await ws.workspace()).script, kind, language)
            _check_box(await runner.run_code(language, CODE, timeout_s=30), kind)

            async def call() -> object:
                return await runner.run_code(language, CODE, timeout_s=30)

            await run_pair(ctx, row, call, spawn, slow=True)
    except Exception as exc:
        row.skipped = row.skipped or skip_reason(exc)
    return row
