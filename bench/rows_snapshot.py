"""Row group 5: snapshot and restore against ``tar`` of the same tree, and restore growth."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import corral

from _corpus import iter_files, make_tree
from _harness import BenchSkip, Ctx, Row, paired, skip_reason
from _providers import SNAPSHOT_PROVIDERS, host_dir, ok, session

# The same compression as corral's snapshot default (gzip level 1).
TAR_C = ["tar", "-I", "gzip -1", "-cf"]
TAR_X = ["tar", "-xzf"]


def _row(
    kind: str, key: str, title: str, subject: str, baseline: str, extra: dict[str, int]
) -> Row:
    return Row(
        id=f"snapshot.{key}.{kind}",
        group="5 snapshot",
        title=title,
        provider=kind,
        subject=subject,
        baseline=baseline,
        extra=dict(extra),
    )


async def _load(kind: str, ses: corral.WorkspaceSession, tree: Path) -> None:
    root = host_dir(ses)
    if root is not None:
        shutil.copytree(tree, root, dirs_exist_ok=True)
        return
    if kind != "in-memory":
        raise BenchSkip("no host directory behind this workspace")
    fs = (await ses.workspace()).fs
    assert fs is not None
    for path, data in iter_files(tree):
        await fs.write_file(path, data)


def _timed(op: Callable[[], object]) -> float:
    t0 = time.perf_counter_ns()
    op()
    return time.perf_counter_ns() - t0


async def _snapshot_id(ses: corral.WorkspaceSession) -> str:
    result = ok(await ses.call("workspace_snapshot", {"label": "bench"}))
    assert result.data is not None
    return str(result.data["snapshot_id"])


async def _measure(
    ctx: Ctx,
    kind: str,
    tree: Path,
    rows: list[Row],
    reps: int,
    *,
    with_snapshot: bool,
) -> None:
    """Fill ``rows`` ([snapshot,] restore) for one provider and tree."""
    scratch = ctx.tmp / "tar"
    scratch.mkdir(exist_ok=True)
    tarball = scratch / "tree.tar.gz"
    out_dir = scratch / "x"

    def tar_c() -> None:
        subprocess.run([*TAR_C, str(tarball), "-C", str(tree), "."], check=True)

    def tar_x() -> None:
        out_dir.mkdir()
        subprocess.run([*TAR_X, str(tarball), "-C", str(out_dir)], check=True)

    try:
        async with session(kind, ctx.tmp / "snap", ("fs", "snapshot")) as ses:
            await _load(kind, ses, tree)
            keep = await _snapshot_id(ses)
            tar_c()
            snap_s: list[float] = []
            snap_b: list[float] = []
            rest_s: list[float] = []
            rest_b: list[float] = []
            for _ in range(reps):
                if with_snapshot:
                    t0 = time.perf_counter_ns()
                    sid = await _snapshot_id(ses)
                    snap_s.append(time.perf_counter_ns() - t0)
                    ok(await ses.call("workspace_delete_snapshot", {"snapshot_id": sid}))
                    snap_b.append(_timed(tar_c))
                t0 = time.perf_counter_ns()
                ok(await ses.call("workspace_restore", {"snapshot_id": keep}))
                rest_s.append(time.perf_counter_ns() - t0)
                rest_b.append(_timed(tar_x))
                shutil.rmtree(out_dir)
            if with_snapshot:
                paired(rows[0], snap_s, snap_b)
            paired(rows[-1], rest_s, rest_b)
            ctx.log(f"{rows[-1].id}: restore {rest_s[len(rest_s) // 2] / 1e6:.0f} ms")
    except BenchSkip as exc:
        for row in rows:
            row.skipped = skip_reason(exc)
    finally:
        tarball.unlink(missing_ok=True)
        shutil.rmtree(out_dir, ignore_errors=True)


async def snapshot_rows(ctx: Ctx) -> list[Row]:
    """Group 5: the big tree per provider, then restore growth on local-bash and in-memory."""
    out: list[Row] = []
    files, size = (1000, 10240) if ctx.quick else (10_000, 10240)
    tree = ctx.tmp / "snap-tree"
    total = make_tree(tree, files, size)
    ctx.log(f"snapshot tree: {files} files, {total / 1e6:.0f} MB")
    shape = {"files": files, "bytes": total}
    label = f"{files // 1000}k files / {total / 1e6:.0f} MB"
    for kind in SNAPSHOT_PROVIDERS:
        rows = [
            _row(
                kind, "snap", f"snapshot {label}", "workspace_snapshot", "tar czf (gzip -1)", shape
            ),
            _row(kind, "restore", f"restore {label}", "workspace_restore", "tar xzf", shape),
        ]
        out += rows
        await _measure(ctx, kind, tree, rows, 2 if ctx.quick else 5, with_snapshot=True)
    shutil.rmtree(tree)
    # Restore growth: per-file cost at 1 KiB, so file count (not bytes) drives it.
    steps = (1000, 3000) if ctx.quick else (1000, 10_000, 30_000)
    for n in steps:
        tree = ctx.tmp / f"growth-{n}"
        total = make_tree(tree, n, 1024, seed=n)
        for kind in ("local-bash", "in-memory"):
            row = _row(
                kind,
                f"growth{n}",
                f"restore growth {n // 1000}k x 1 KiB",
                "workspace_restore",
                "tar xzf",
                {"files": n, "bytes": total},
            )
            out.append(row)
            await _measure(ctx, kind, tree, [row], 2 if ctx.quick else 3, with_snapshot=False)
            if row.subject_ns is not None:
                row.extra["us_per_file"] = row.subject_ns.median / 1000 / n
        shutil.rmtree(tree)
    return out
