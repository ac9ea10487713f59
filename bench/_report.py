"""The machine description, the printed table and the JSON file."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _notes import NOTES

from _harness import Row, Stats, fmt_ns, fmt_num


def _first_line(argv: list[str]) -> str | None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = (proc.stdout or proc.stderr).strip().splitlines()
    return out[0] if proc.returncode == 0 and out else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _fs_type(path: Path) -> str:
    best, kind = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            _dev, mount, fstype, *_ = line.split()
            if str(path).startswith(mount) and len(mount) > len(best):
                best, kind = mount, fstype
    except OSError:
        pass
    return kind


def machine(scratch: Path) -> dict[str, Any]:
    """What the figures were measured on (``scratch``: where the workspaces lived)."""
    return {
        "scratch": f"{scratch} ({_fs_type(scratch.resolve())})",
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "grep": _first_line(["grep", "--version"]),
        "rg": _first_line(["rg", "--version"]),
        "tar": _first_line(["tar", "--version"]),
        "bwrap": _first_line(["bwrap", "--version"]),
        "docker": _first_line(["docker", "version", "--format", "{{.Server.Version}}"]),
    }


def _status(row: Row) -> str:
    status = row.status
    if status in ("ok", "MISS") and row.goal is not None and row.goal.kind == "added_us":
        assert row.added_ns is not None
        added = row.added_ns.median / 1000
        return f"{status} ({'+' if added >= 0 else ''}{fmt_num(added)} us)"
    return status


def _median(stats: Stats | None) -> float | None:
    return None if stats is None else stats.median


def _ratio(row: Row, which: str) -> str:
    if row.ratio is None:
        return "-"
    return fmt_num(row.ratio.median if which == "median" else row.ratio.p95) + "x"


def table(rows: Sequence[Row], info: dict[str, Any], header: str) -> str:
    """The Markdown table with footnotes for misses and skips."""
    head = [
        "row",
        "provider",
        "subject",
        "baseline",
        "ratio med",
        "ratio p95",
        "goal",
        "status",
        "subject med",
        "baseline med",
    ]
    body = [
        [
            row.title,
            row.provider,
            row.subject,
            row.baseline,
            _ratio(row, "median"),
            _ratio(row, "p95"),
            row.goal.text if row.goal else "",
            _status(row),
            row.shown or fmt_ns(_median(row.subject_ns)),
            fmt_ns(_median(row.baseline_ns)),
        ]
        for row in rows
    ]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [header, "", line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(cells) for cells in body]
    out.append("")
    out.append(
        f"Machine: {info['nproc']} x {info['cpu']}, {info['kernel']}, Python {info['python']}, "
        f"{info['date']}."
    )
    misses = [r for r in rows if r.status == "MISS"]
    if misses:
        out += ["", "Goals missed:"]
        for row in misses:
            note = NOTES.get(row.id, "no explanation recorded for this row yet")
            out.append(f"- {row.title} ({row.provider}): {note}")
    skips: dict[str, list[str]] = {}
    for row in rows:
        if row.skipped is not None:
            skips.setdefault(row.skipped, []).append(f"{row.title} ({row.provider})")
    if skips:
        out += ["", "Skipped:"]
        for reason, names in skips.items():
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            out.append(f"- {shown}: {reason}")
    return "\n".join(out)


def write_json(path: Path, rows: Sequence[Row], info: dict[str, Any], meta: dict[str, Any]) -> None:
    """The same figures as JSON, for comparing commits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"schema": 1, "machine": info, **meta, "rows": [r.to_json() for r in rows]}
    path.write_text(json.dumps(doc, indent=2) + "\n")
