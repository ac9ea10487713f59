"""Row group 1: tool-layer and module overhead of read / write / stat of a 4 KiB file."""

from __future__ import annotations

import os
from collections.abc import Callable

import corral

from _harness import BenchSkip, Ctx, Goal, Row, run_pair, skip_reason
from _providers import PROVIDERS, host_dir, ok, session

CONTENT = "".join(f"line {i:04d}: the quick brown fox jumps over the lazy dog\n" for i in range(80))
DATA = CONTENT.encode()[:4096]
TEXT = DATA.decode()
READ_PATH = "/bench/f.txt"
WRITE_PATH = "/bench/w.txt"
TOOL_GOAL = Goal("added_us", 20)
RAW_GOALS = {("local-bash", "read"): Goal("ratio", 3), ("local-bash", "write"): Goal("ratio", 1.5)}
OPS = ("read", "write", "stat")


def _rows(kind: str) -> list[Row]:
    rows: list[Row] = []
    for op in OPS:
        rows.append(
            Row(
                id=f"fs.{op}.tool.{kind}",
                group="1 fs",
                title=f"{op} 4 KiB: tool vs module",
                provider=kind,
                subject=f"workspace_{op if op == 'stat' else op + '_file'}",
                baseline=f"ws.fs.{op if op == 'stat' else op + '_file'}",
                goal=TOOL_GOAL,
            )
        )
        raw = {
            "read": "dict lookup" if kind == "in-memory" else "open().read()",
            "write": "dict store" if kind == "in-memory" else "tmp+fsync+rename",
            "stat": "len(dict[k])" if kind == "in-memory" else "os.stat",
        }[op]
        rows.append(
            Row(
                id=f"fs.{op}.module.{kind}",
                group="1 fs",
                title=f"{op} 4 KiB: module vs raw",
                provider=kind,
                subject=f"ws.fs.{op if op == 'stat' else op + '_file'}",
                baseline=raw,
                goal=RAW_GOALS.get((kind, op)),
            )
        )
    return rows


def _raw_ops(kind: str, ses: corral.WorkspaceSession) -> dict[str, Callable[[], object]]:
    if kind == "in-memory":
        store: dict[str, bytes] = {READ_PATH: DATA}

        def read() -> bytes:
            return store[READ_PATH]

        def write() -> None:
            store[WRITE_PATH] = DATA

        def stat() -> int:
            return len(store[READ_PATH])

        return {"read": read, "write": write, "stat": stat}
    root = host_dir(ses)
    if root is None:
        raise BenchSkip("no host directory behind this workspace")
    src = root / READ_PATH.lstrip("/")
    raw_dir = root / "raw"
    raw_dir.mkdir(exist_ok=True)
    target, tmp = raw_dir / "w.txt", raw_dir / ".w.txt.tmp"

    def raw_read() -> bytes:
        with open(src, "rb") as f:
            return f.read()

    def raw_write() -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, DATA)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)

    def raw_stat() -> os.stat_result:
        return os.stat(src)

    return {"read": raw_read, "write": raw_write, "stat": raw_stat}


async def _provider_rows(ctx: Ctx, kind: str) -> list[Row]:
    rows = _rows(kind)
    try:
        async with session(kind, ctx.tmp / "fs", ("fs",)) as ses:
            ok(await ses.call("workspace_write_file", {"path": READ_PATH, "content": TEXT}))
            fs = (await ses.workspace()).fs
            assert fs is not None
            read_args, stat_args = {"path": READ_PATH}, {"path": READ_PATH}
            write_args = {"path": WRITE_PATH, "content": TEXT}

            async def tool_read() -> corral.ToolResult:
                result: corral.ToolResult = await ses.call("workspace_read_file", read_args)
                return result

            async def tool_write() -> corral.ToolResult:
                result: corral.ToolResult = await ses.call("workspace_write_file", write_args)
                return result

            async def tool_stat() -> corral.ToolResult:
                result: corral.ToolResult = await ses.call("workspace_stat", stat_args)
                return result

            async def mod_read() -> object:
                return await fs.read_file(READ_PATH)

            async def mod_write() -> None:
                await fs.write_file(WRITE_PATH, DATA)

            async def mod_stat() -> object:
                return await fs.stat(READ_PATH)

            tools = {"read": tool_read, "write": tool_write, "stat": tool_stat}
            module = {"read": mod_read, "write": mod_write, "stat": mod_stat}
            for call in tools.values():
                ok(await call())
            try:
                raw: dict[str, Callable[[], object]] | None = _raw_ops(kind, ses)
                raw_reason = ""
            except BenchSkip as exc:
                raw, raw_reason = None, skip_reason(exc)
            slow = kind == "docker"
            for i, op in enumerate(OPS):
                await run_pair(ctx, rows[2 * i], tools[op], module[op], slow=slow)
                if raw is None:
                    rows[2 * i + 1].skipped = raw_reason
                else:
                    await run_pair(ctx, rows[2 * i + 1], module[op], raw[op], slow=slow)
    except BenchSkip as exc:
        for row in rows:
            if row.skipped is None and row.ratio is None:
                row.skipped = skip_reason(exc)
    return rows


async def fs_rows(ctx: Ctx) -> list[Row]:
    """Rows of group 1 for every provider."""
    out: list[Row] = []
    for kind in PROVIDERS:
        out += await _provider_rows(ctx, kind)
    return out
