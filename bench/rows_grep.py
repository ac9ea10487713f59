"""Row group 4: ``workspace_grep`` throughput against GNU grep and ripgrep on one corpus."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import corral

from _corpus import iter_files, make_tree
from _harness import BenchSkip, Ctx, Goal, Row, paired, skip_reason
from _providers import PROVIDERS, host_dir, ok, session

PATTERN = "needle_[0-9]+"
ARGS = {"pattern": PATTERN, "max_results": 10000}


def _rows(kind: str, engine: str) -> tuple[Row, Row]:
    subject = "workspace_grep" + (" (re2)" if engine == "re2" else "")
    suffix = f"{kind}.re2" if engine == "re2" else kind
    return (
        Row(
            id=f"grep.gnu.{suffix}",
            group="4 grep",
            title="grep corpus",
            provider=kind,
            subject=subject,
            baseline="grep -rnE",
            goal=Goal("ratio", 1.0),
        ),
        Row(
            id=f"grep.rg.{suffix}",
            group="4 grep",
            title="grep corpus",
            provider=kind,
            subject=subject,
            baseline="rg -n",
        ),
    )


def _tool(binary: str, argv: list[str]) -> Callable[[], None] | None:
    if shutil.which(binary) is None:
        return None

    def run() -> None:
        # Exit 1 means "no match", which would make the comparison meaningless.
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)

    return run


async def _load(kind: str, ses: corral.WorkspaceSession, corpus: Path) -> None:
    root = host_dir(ses)
    if root is not None:
        shutil.copytree(corpus, root, dirs_exist_ok=True)
        return
    if kind != "in-memory":
        raise BenchSkip("no host directory behind this workspace")
    fs = (await ses.workspace()).fs
    assert fs is not None
    for path, data in iter_files(corpus):
        await fs.write_file(path, data)


async def _measure(
    ctx: Ctx,
    rows: tuple[Row, Row],
    subject: Callable[[], Awaitable[Any]],
    gnu: Callable[[], None] | None,
    rg: Callable[[], None] | None,
) -> None:
    ops: list[tuple[str, Callable[[], Any]]] = [("s", subject)]
    ops += [(k, f) for k, f in (("g", gnu), ("r", rg)) if f is not None]
    times: dict[str, list[float]] = {k: [] for k, _ in ops}
    reps = 3 if ctx.quick else 7
    for i in range(reps + 1):  # the first round warms caches and is dropped
        order = ops[i % len(ops) :] + ops[: i % len(ops)]
        for key, op in order:
            t0 = time.perf_counter_ns()
            result = op()
            if result is not None:
                await result
            if i:
                times[key].append(time.perf_counter_ns() - t0)
    for row, key, missing in ((rows[0], "g", "GNU grep"), (rows[1], "r", "rg")):
        if key in times:
            paired(row, times["s"], times[key])
        else:
            row.skipped = f"{missing} is not installed"
    ctx.log(f"{rows[0].id}: {times['s'][len(times['s']) // 2] / 1e6:.0f} ms")


def _check_first(result: corral.ToolResult) -> None:
    assert result.data is not None
    if result.data["truncated"] or not result.data["matches"]:
        raise BenchSkip("grep result is empty or truncated: corpus and pattern disagree")


async def grep_rows(ctx: Ctx) -> list[Row]:
    """Group 4, per provider (and re2 on local-bash)."""
    corpus = ctx.tmp / "grep-corpus"
    files, size = (600, 8192) if ctx.quick else (3000, 10240)
    total = make_tree(corpus, files, size, binary_every=20)
    gnu = _tool("grep", ["grep", "-rnE", PATTERN, str(corpus)])
    rg = _tool("rg", ["rg", "-n", "--no-config", PATTERN, str(corpus)])
    ctx.log(f"grep corpus: {files} files, {total / 1e6:.1f} MB")
    out: list[Row] = []
    plan = [(kind, "regex") for kind in PROVIDERS]
    plan.insert(2, ("local-bash", "re2"))
    for kind, engine in plan:
        rows = _rows(kind, engine)
        out += rows
        for row in rows:
            row.extra = {"files": files, "bytes": total, "pattern": PATTERN}
        try:
            re2 = corral.Re2Engine() if engine == "re2" else None
            async with session(kind, ctx.tmp / "grep", ("fs",), regex_engine=re2) as ses:
                await _load(kind, ses, corpus)
                first = ok(await ses.call("workspace_grep", ARGS))
                assert first.data is not None
                _check_first(first)
                rows[0].extra["matches"] = len(first.data["matches"])
                rows[0].extra["skipped_binary"] = len(first.data["skipped_binary_paths"])

                async def subject() -> corral.ToolResult:
                    result: corral.ToolResult = await ses.call("workspace_grep", ARGS)
                    return result

                await _measure(ctx, rows, subject, gnu, rg)
        except (BenchSkip, ImportError) as exc:
            for row in rows:
                row.skipped = skip_reason(exc)
    return out
