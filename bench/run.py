"""corral's benchmark harness: ``make bench`` (or ``python bench/run.py [--quick] [--only ROWS]``).

Prints one Markdown table of ratios against baselines measured in the same
run, and writes the same figures to ``bench/results/latest.json`` (and
``--json PATH``). Nothing here is a test: no exit status depends on time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from _harness import Ctx, Row
from _report import machine, table, write_json
from rows_code import code_rows
from rows_docker_process import docker_process_rows
from rows_exec import open_rows, run_rows
from rows_fs import fs_rows
from rows_grep import grep_rows
from rows_process import process_rows
from rows_ray import ray_rows
from rows_scale import scale_rows
from rows_script import script_rows
from rows_server import server_rows
from rows_snapshot import snapshot_rows
from rows_versions import versions_rows

HERE = Path(__file__).resolve().parent
GROUPS: dict[str, tuple[str, Callable[[Ctx], Awaitable[list[Row]]]]] = {
    "fs": ("1", fs_rows),
    "run": ("2", run_rows),
    "open": ("3", open_rows),
    "grep": ("4", grep_rows),
    "snapshot": ("5", snapshot_rows),
    "scale": ("6", scale_rows),
    "script": ("7", script_rows),
    "versions": ("8", versions_rows),
    "process": ("10", process_rows),
    "dockerproc": ("11", docker_process_rows),
    "ray": ("12", ray_rows),
    "code": ("13", code_rows),
    "server": ("14", server_rows),
}


def default_scratch() -> Path:
    """/dev/shm when it is a tmpfs with 4 GiB free, so file-count-bound rows measure
    corral rather than a shared disk; else the system temp dir."""
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
    except OSError:
        return Path(tempfile.gettempdir())
    if st.f_bavail * st.f_frsize >= 4 * 1024**3 and os.access(shm, os.W_OK):
        return shm
    return Path(tempfile.gettempdir())


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a fast subset (under a minute)")
    parser.add_argument(
        "--only",
        metavar="ROWS",
        help="comma-separated groups by name or number: "
        + ", ".join(f"{n}={k}" for k, (n, _) in GROUPS.items()),
    )
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write the JSON here")
    parser.add_argument(
        "--render",
        metavar="JSON",
        type=Path,
        help="print the table of a saved run instead of measuring",
    )
    parser.add_argument(
        "--tmp",
        metavar="DIR",
        type=Path,
        default=default_scratch(),
        help="scratch directory for workspaces and trees (default: /dev/shm when it is a "
        "roomy tmpfs, else the system temp dir)",
    )
    parser.add_argument(
        "--backend",
        choices=("asyncio", "trio"),
        default="asyncio",
        help="anyio backend the async benchmarks run on (default asyncio)",
    )
    args = parser.parse_args(argv)
    if args.only:
        by_number = {n: k for k, (n, _) in GROUPS.items()}
        chosen = []
        for item in args.only.split(","):
            name = by_number.get(item.strip(), item.strip())
            if name not in GROUPS:
                parser.error(f"unknown row group {item!r}")
            chosen.append(name)
        args.groups = [g for g in GROUPS if g in chosen]
    else:
        args.groups = list(GROUPS)
    return args


async def _main(args: argparse.Namespace, tmp: Path) -> list[Row]:
    ctx = Ctx(quick=args.quick, tmp=tmp)
    rows: list[Row] = []
    for name in args.groups:
        number, func = GROUPS[name]
        started = time.monotonic()
        ctx.log(f"group {number} {name}")
        rows += await func(ctx)
        ctx.log(f"group {number} {name} done in {time.monotonic() - started:.1f}s")
    return rows


def _header(meta: dict[str, Any], info: dict[str, Any]) -> str:
    return (
        f"corral bench ({meta['mode']}, groups {','.join(meta['groups'])}, anyio backend "
        f"{meta['backend']}, scratch {info['scratch']}, {meta['elapsed_s']:.0f}s). "
        "Ratios are subject / baseline per paired repetition; "
        "absolute times are for information only."
    )


def main(argv: list[str] | None = None) -> int:
    """Run the chosen groups, print the table, write the JSON; always 0 unless it crashed."""
    args = _parse(argv)
    if args.render is not None:
        doc = json.loads(args.render.read_text())
        rows = [Row.from_json(r) for r in doc["rows"]]
        print(table(rows, doc["machine"], _header(doc, doc["machine"])))
        return 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="corral-bench-", dir=args.tmp) as tmp:
        rows = anyio.run(_main, args, Path(tmp), backend=args.backend)
    elapsed = time.monotonic() - started
    info = machine(args.tmp)
    mode = "quick" if args.quick else "full"
    meta = {"mode": mode, "groups": args.groups, "backend": args.backend, "elapsed_s": elapsed}
    print(table(rows, info, _header(meta, info)))
    write_json(HERE / "results" / "latest.json", rows, info, meta)
    if args.json is not None:
        write_json(args.json, rows, info, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
