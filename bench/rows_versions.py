"""Row group 8: versions (issue 16) against tar / cp of the same tree, and their growth.

On local-sandbox (the posix-core version store every tmpdir provider and
docker share, with the change journal bubblewrap makes sound), at 1k / 10k /
100k files of 1 KiB and a 100 MB tree:

* snapshot after changing 10 files vs ``tar czf`` of the tree (goal >= 20x faster);
* restore to a version differing in 10 files vs ``tar xzf`` (goal >= 20x faster);
* branch of a version vs ``cp -a`` of the tree (goal <= 1x);
* reading one file from a version vs reading it live (module calls, goal <= 2x).

The 100k tree runs only in the full run. The last rows print how each
subject's median grew from the smallest to the largest file count.

Where the floor is: with the change journal (``corral_posix._changes``),
snapshot and restore read only the directories where something happened,
and take the rest over from the previous manifest in whole-list slices, so
at 100k files what remains is the manifest itself (building, encoding and
fsyncing 100k entries). The same rows on local-bash (``versions.walk.*``,
no goal) show the whole-tree walk the journal replaces there: local-bash's
commands are unconfined, so a write through a hard link from outside the
workspace would leave no event, and local-bash never keeps a journal.
Branch and reads verify every blob's SHA-256 the first time the process
meets it; after that a blob whose file is unchanged is copied by the
kernel, or written from memory when it is small (``_blobstore._CONTENT``),
so a branch costs about what creating the files costs.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

import corral
import corral.provider

from _corpus import make_tree
from _harness import BenchSkip, Ctx, Goal, Row, paired, run_pair, skip_reason
from _providers import host_dir, ok, session

KIND = "local-sandbox"
WALK_KIND = "local-bash"
TAR_C = ["tar", "-czf"]
TAR_X = ["tar", "-xzf"]
CHANGED = 10


def _row(
    key: str, label: str, title: str, subject: str, baseline: str, goal: Goal, kind: str
) -> Row:
    walk = kind == WALK_KIND
    return Row(
        id=f"versions.walk.{key}.{label}" if walk else f"versions.{key}.{label}",
        group="8 versions",
        title=f"{title} {label}",
        provider=kind,
        subject=subject,
        baseline=baseline,
        goal=None if walk else goal,
    )


def _timed(op: Callable[[], object]) -> float:
    t0 = time.perf_counter_ns()
    op()
    return time.perf_counter_ns() - t0


def _change(root: Path, files: list[Path], rep: int) -> None:
    """Rewrite 10 files (same size, new content) as an agent's edit would."""
    for i, rel in enumerate(files[:CHANGED]):
        path = root / rel
        data = path.read_bytes()
        stamp = f"{rep:06d}{i:04d}".encode()
        path.write_bytes(stamp + data[len(stamp) :])


async def _measure(ctx: Ctx, tree: Path, label: str, reps: int, kind: str = KIND) -> list[Row]:
    rows = [
        _row(
            "snapshot",
            label,
            "snapshot after 10 changed,",
            "workspace_snapshot",
            "tar czf",
            Goal("ratio", 0.05),
            kind,
        ),
        _row(
            "restore",
            label,
            "restore 10 differing,",
            "workspace_restore",
            "tar xzf",
            Goal("ratio", 0.05),
            kind,
        ),
        _row("branch", label, "branch,", "Versions.branch", "cp -a", Goal("ratio", 1.0), kind),
        _row(
            "read",
            label,
            "read one file at a version,",
            "read_file_at",
            "fs.read_file",
            Goal("ratio", 2.0),
            kind,
        ),
    ]
    scratch = ctx.tmp / "versions-scratch"
    scratch.mkdir(exist_ok=True)
    tarball = scratch / "tree.tar.gz"
    out_dir = scratch / "x"
    copy_dir = scratch / "cp"
    try:
        async with session(kind, ctx.tmp / "versions", ("fs", "snapshot")) as ses:
            root, snap, fs = await _parts(ses)
            shutil.copytree(tree, root, dirs_exist_ok=True)
            # Files written within the store's racy window (0.1 s) of a snapshot are read
            # again by the next one (git's "racily clean" rule); an agent's tree is not
            # rewritten wholesale just before its base snapshot, so let the window pass.
            await anyio.sleep(0.2)
            files = _files(tree)
            step = max(1, len(files) // CHANGED)
            spread = files[::step]
            base = str(
                ok(await ses.call("workspace_snapshot", {"label": "base"})).data["snapshot_id"]
            )  # type: ignore[index]
            samples: dict[str, tuple[list[float], list[float]]] = {r.id: ([], []) for r in rows[:3]}
            for rep in range(reps):
                _change(root, spread, rep)
                t0 = time.perf_counter_ns()
                sid = str(ok(await ses.call("workspace_snapshot", {})).data["snapshot_id"])  # type: ignore[index]
                s = time.perf_counter_ns() - t0
                b = _timed(
                    lambda: subprocess.run([*TAR_C, str(tarball), "-C", str(root), "."], check=True)
                )
                samples[rows[0].id][0].append(s)
                samples[rows[0].id][1].append(b)
                t0 = time.perf_counter_ns()
                ok(await ses.call("workspace_restore", {"snapshot_id": base}))
                s = time.perf_counter_ns() - t0
                out_dir.mkdir()
                b = _timed(
                    lambda: subprocess.run([*TAR_X, str(tarball), "-C", str(out_dir)], check=True)
                )
                shutil.rmtree(out_dir)
                samples[rows[1].id][0].append(s)
                samples[rows[1].id][1].append(b)
                t0 = time.perf_counter_ns()
                branch_ref = await snap.branch(base)
                s = time.perf_counter_ns() - t0
                b = _timed(
                    lambda: subprocess.run(["cp", "-a", str(root), str(copy_dir)], check=True)
                )
                shutil.rmtree(copy_dir)
                _drop_branch(branch_ref)
                samples[rows[2].id][0].append(s)
                samples[rows[2].id][1].append(b)
                await snap.delete(sid)
            for row in rows[:3]:
                paired(row, *samples[row.id])
            path = "/" + str(spread[0])

            async def at() -> None:
                await snap.read_file_at(base, path)

            async def live() -> None:
                await fs.read_file(path)

            await run_pair(ctx, rows[3], at, live)
            for row in rows[:3]:
                assert row.subject_ns is not None
                assert row.baseline_ns is not None
                ctx.log(
                    f"{row.id}: {row.subject_ns.median / 1e6:.1f} ms vs "
                    f"{row.baseline_ns.median / 1e6:.1f} ms"
                )
    except BenchSkip as exc:
        for row in rows:
            row.skipped = skip_reason(exc)
    finally:
        tarball.unlink(missing_ok=True)
        shutil.rmtree(out_dir, ignore_errors=True)
        shutil.rmtree(copy_dir, ignore_errors=True)
    return rows


async def _parts(
    ses: corral.WorkspaceSession,
) -> tuple[Path, corral.provider.Versions, corral.provider.FileSystem]:
    root = host_dir(ses)
    if root is None:
        raise BenchSkip("no host directory behind this workspace")
    ws = await ses.workspace()
    snap, fs = ws.snapshot, ws.fs
    if not isinstance(snap, corral.provider.Versions) or fs is None:
        raise BenchSkip("the snapshot module offers no corral.provider.Versions")
    return root, snap, fs


def _files(tree: Path) -> list[Path]:
    return sorted(p.relative_to(tree) for p in tree.rglob("*") if p.is_file())


def _drop_branch(ref: corral.WorkspaceRef) -> None:
    payload: Any = ref.payload
    shutil.rmtree(Path(payload["base_dir"]) / payload["workspace"], ignore_errors=True)


def _growth(rows_by_size: list[tuple[int, list[Row]]]) -> list[Row]:
    """One info row per operation: its median at the largest count / at the smallest."""
    (small_n, small), (big_n, big) = rows_by_size[0], rows_by_size[-1]
    out = []
    for a, b in zip(small, big, strict=True):
        kind = a.id.split(".")[1]
        row = Row(
            id=f"versions.growth.{kind}",
            group="8 versions",
            title=f"{kind} growth {small_n // 1000}k -> {big_n // 1000}k files",
            provider=KIND,
            subject=f"{kind} at {big_n // 1000}k",
            baseline=f"{kind} at {small_n // 1000}k",
        )
        if a.subject_ns is None or b.subject_ns is None:
            row.skipped = "a size was skipped"
        else:
            paired(row, [b.subject_ns.median], [a.subject_ns.median])
            row.extra = {"files_ratio": big_n / small_n}
        out.append(row)
    return out


async def versions_rows(ctx: Ctx) -> list[Row]:
    """Group 8: the four operations per tree size, then their growth."""
    out: list[Row] = []
    counts = (1000, 10_000) if ctx.quick else (1000, 10_000, 100_000)
    reps = 3 if ctx.quick else 5
    by_size: list[tuple[int, list[Row]]] = []
    for n in counts:
        tree = ctx.tmp / f"versions-{n}"
        total = make_tree(tree, n, 1024, seed=n)
        ctx.log(f"versions tree: {n} files, {total / 1e6:.1f} MB")
        rows = await _measure(ctx, tree, f"{n // 1000}k x 1 KiB", reps)
        for row in rows:
            row.extra = {"files": n, "bytes": total}
        by_size.append((n, rows))
        out += rows
        if n == counts[-1]:
            # The whole-tree walk the journal replaces, on the provider without one.
            walk = await _measure(ctx, tree, f"{n // 1000}k x 1 KiB", reps, WALK_KIND)
            for row in walk:
                row.extra = {"files": n, "bytes": total}
            out += walk
        shutil.rmtree(tree)
    tree = ctx.tmp / "versions-100mb"
    big_files = 1000  # of 100 KiB: about 100 MB
    total = make_tree(tree, big_files, 100 * 1024, seed=3)
    ctx.log(f"versions tree: {big_files} files, {total / 1e6:.0f} MB")
    rows = await _measure(ctx, tree, f"{total // 1_000_000} MB", reps)
    for row in rows:
        row.extra = {"files": big_files, "bytes": total}
    out += rows
    shutil.rmtree(tree)
    out += _growth(by_size)
    return out
