"""Timing, statistics and the result row of the benchmark harness.

Every comparison is *paired*: each repetition times a batch of the subject and
a batch of the baseline back to back (the order alternates between
repetitions), and the ratio is taken per repetition. Drift on a noisy machine
(another job starting, CPU frequency changing) then moves both sides of a pair
together, and the median and p95 of the per-repetition ratios stay stable.
"""

from __future__ import annotations

import inspect
import math
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Op = Callable[[], Any] | Callable[[], Awaitable[Any]]


class BenchSkip(Exception):
    """Raised to turn the rows of a provider (or a baseline) into skipped rows."""


@dataclass(frozen=True)
class Goal:
    """A target a row is checked against, on its median.

    Attributes:
        kind: ``ratio`` (subject / baseline) or ``added_us`` (subject - baseline).
        limit: The largest value that still meets the goal.
    """

    kind: Literal["ratio", "added_us"]
    limit: float

    @property
    def text(self) -> str:
        """The goal as the table prints it."""
        if self.kind == "ratio":
            return f"<= {self.limit:g}x"
        return f"<= +{self.limit:g} us"


@dataclass(frozen=True)
class Stats:
    """Median and p95 of a sample list."""

    median: float
    p95: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        """Median and nearest-rank p95 of non-empty samples."""
        ordered = sorted(samples)
        rank = max(1, math.ceil(0.95 * len(ordered)))
        return cls(statistics.median(ordered), ordered[rank - 1])


@dataclass
class Row:
    """One line of the table (and one object of the JSON).

    Times are nanoseconds per operation. ``ratio`` is subject / baseline,
    ``added_ns`` subject - baseline, both computed per repetition.
    """

    id: str
    group: str
    title: str
    provider: str
    subject: str
    baseline: str
    ratio: Stats | None = None
    subject_ns: Stats | None = None
    baseline_ns: Stats | None = None
    added_ns: Stats | None = None
    goal: Goal | None = None
    reps: int = 0
    batch: tuple[int, int] = (0, 0)
    skipped: str | None = None
    shown: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        """``skip``, ``info`` (no goal), ``ok`` or ``MISS``."""
        if self.skipped is not None:
            return "skip"
        if self.goal is None:
            return "info"
        if self.goal.kind == "ratio":
            assert self.ratio is not None
            value = self.ratio.median
        else:
            assert self.added_ns is not None
            value = self.added_ns.median / 1000
        return "ok" if value <= self.goal.limit else "MISS"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        """A row back from :meth:`to_json` output (to re-render a saved run)."""

        def st(value: dict[str, float] | None) -> Stats | None:
            return None if value is None else Stats(value["median"], value["p95"])

        goal = data["goal"]
        return cls(
            id=data["id"],
            group=data["group"],
            title=data["title"],
            provider=data["provider"],
            subject=data["subject"],
            baseline=data["baseline"],
            ratio=st(data["ratio"]),
            subject_ns=st(data["subject_ns"]),
            baseline_ns=st(data["baseline_ns"]),
            added_ns=st(data["added_ns"]),
            goal=None if goal is None else Goal(goal["kind"], goal["limit"]),
            reps=data["reps"],
            batch=tuple(data["batch"]),
            skipped=data["skipped"],
            shown=data.get("shown"),
            extra=data["extra"],
        )

    def to_json(self) -> dict[str, Any]:
        """The row as plain JSON data."""

        def st(s: Stats | None) -> dict[str, float] | None:
            return None if s is None else {"median": s.median, "p95": s.p95}

        return {
            "id": self.id,
            "group": self.group,
            "title": self.title,
            "provider": self.provider,
            "subject": self.subject,
            "baseline": self.baseline,
            "status": self.status,
            "ratio": st(self.ratio),
            "subject_ns": st(self.subject_ns),
            "baseline_ns": st(self.baseline_ns),
            "added_ns": st(self.added_ns),
            "goal": None
            if self.goal is None
            else {"kind": self.goal.kind, "limit": self.goal.limit},
            "reps": self.reps,
            "batch": list(self.batch),
            "skipped": self.skipped,
            "shown": self.shown,
            "extra": self.extra,
        }


@dataclass(frozen=True)
class Budget:
    """How hard to measure one pair.

    Attributes:
        batch_s: Target wall time of one batch (sub-millisecond ops are batched).
        min_reps, max_reps: Bounds on the repetitions.
        seconds: Time for the whole pair; reps are cut to fit, never below min_reps.
        warmup_s: Time spent warming each side up before measuring.
    """

    batch_s: float = 0.005
    min_reps: int = 11
    max_reps: int = 41
    seconds: float = 2.0
    warmup_s: float = 0.05


async def _run_n(op: Op, n: int) -> int:
    """Run ``op`` n times and return the elapsed nanoseconds."""
    if inspect.iscoroutinefunction(op):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            await op()
        return time.perf_counter_ns() - t0
    t0 = time.perf_counter_ns()
    for _ in range(n):
        op()
    return time.perf_counter_ns() - t0


async def _warm_and_size(op: Op, budget: Budget) -> tuple[int, float]:
    """Warm ``op`` up; return its batch size and estimated ns per op."""
    spent, calls = 0, 0
    while calls < 2 or spent < budget.warmup_s * 1e9:
        spent += await _run_n(op, 1)
        calls += 1
        if spent > 20 * budget.warmup_s * 1e9:  # a slow op: a few calls are enough
            break
    per_op = spent / calls
    return max(1, min(100_000, round(budget.batch_s * 1e9 / max(per_op, 1.0)))), per_op


async def compare(
    row: Row,
    subject: Op,
    baseline: Op,
    budget: Budget,
    *,
    setup: Callable[[], Awaitable[None]] | None = None,
) -> Row:
    """Measure subject against baseline, paired per repetition, and fill ``row``.

    Args:
        row: The row to fill (its ids, titles and goal are kept).
        subject: The operation under test (sync or async, no arguments).
        baseline: The reference operation measured in the same repetitions.
        budget: Batch size, repetitions and time limits.
        setup: Awaited before every repetition, outside the timing.
    """
    batch_s, per_s = await _warm_and_size(subject, budget)
    batch_b, per_b = await _warm_and_size(baseline, budget)
    rep_ns = batch_s * per_s + batch_b * per_b
    reps = int(budget.seconds * 1e9 / max(rep_ns, 1.0))
    reps = max(budget.min_reps, min(budget.max_reps, reps))
    s_ns: list[float] = []
    b_ns: list[float] = []
    for i in range(reps):
        if setup is not None:
            await setup()
        if i % 2 == 0:
            s = await _run_n(subject, batch_s)
            b = await _run_n(baseline, batch_b)
        else:
            b = await _run_n(baseline, batch_b)
            s = await _run_n(subject, batch_s)
        s_ns.append(s / batch_s)
        b_ns.append(b / batch_b)
    row.subject_ns = Stats.of(s_ns)
    row.baseline_ns = Stats.of(b_ns)
    row.ratio = Stats.of([s / b for s, b in zip(s_ns, b_ns, strict=True)])
    row.added_ns = Stats.of([s - b for s, b in zip(s_ns, b_ns, strict=True)])
    row.reps = reps
    row.batch = (batch_s, batch_b)
    return row


def paired(row: Row, s_ns: Sequence[float], b_ns: Sequence[float]) -> Row:
    """Fill ``row`` from per-repetition times measured elsewhere (one op each)."""
    row.subject_ns = Stats.of(s_ns)
    row.baseline_ns = Stats.of(b_ns)
    row.ratio = Stats.of([s / b for s, b in zip(s_ns, b_ns, strict=True)])
    row.added_ns = Stats.of([s - b for s, b in zip(s_ns, b_ns, strict=True)])
    row.reps = len(s_ns)
    row.batch = (1, 1)
    return row


def _median(stats: Stats | None) -> float | None:
    return None if stats is None else stats.median


def skip_reason(exc: BaseException) -> str:
    """A one-line reason from an exception, for a skipped row."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, BenchSkip):
        return text[:160]
    return f"{type(exc).__name__}: {text}"[:160]


def fmt_ns(ns: float | None) -> str:
    """A duration with a unit that keeps three significant digits."""
    if ns is None:
        return "-"
    units = ((1e9, "s"), (1e6, "ms"), (1e3, "us"))
    scale, unit = next(((s, u) for s, u in units if abs(ns) >= s), (1.0, "ns"))
    return f"{fmt_num(ns / scale)} {unit}"


def fmt_num(value: float) -> str:
    """Three significant digits without exponent notation (``0.512``, ``12.3``, ``457``)."""
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


@dataclass
class Ctx:
    """What every row group gets: mode, scratch directory and a progress logger.

    Attributes:
        quick: The fast subset (smaller trees, fewer repetitions).
        tmp: Scratch directory for workspaces, corpora and tarballs.
    """

    quick: bool
    tmp: Path

    def budget(self, *, slow: bool = False) -> Budget:
        """The measuring effort for a pair; ``slow`` for ops of a millisecond or more."""
        if self.quick:
            return Budget(min_reps=5 if slow else 7, max_reps=9 if slow else 15, seconds=0.4)
        if slow:
            return Budget(min_reps=11, max_reps=31, seconds=3.0)
        return Budget(min_reps=15, max_reps=51, seconds=1.5)

    def log(self, message: str) -> None:
        """Progress on stderr, so stdout carries only the table."""
        print(f"  .. {message}", file=sys.stderr, flush=True)


def skipped_rows(rows: Sequence[Row], reason: str) -> list[Row]:
    """Mark every row skipped with ``reason``; return them."""
    for row in rows:
        row.skipped = reason
    return list(rows)


async def run_pair(ctx: Ctx, row: Row, subject: Op, baseline: Op, *, slow: bool = False) -> Row:
    """:func:`compare` with the context's budget; a failure skips this row only."""
    try:
        await compare(row, subject, baseline, ctx.budget(slow=slow))
    except Exception as exc:
        row.skipped = skip_reason(exc)
    done = row.skipped or f"{fmt_ns(_median(row.subject_ns))} vs {fmt_ns(_median(row.baseline_ns))}"
    ctx.log(f"{row.id}: {done}")
    return row
