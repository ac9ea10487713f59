"""Progress of long operations: the reporter's throttle and guard, the context seam, the bar."""

from __future__ import annotations

import io
import logging
import os
import threading

import anyio
import anyio.to_thread
import pytest

import corral
import corral.provider
from corral import Progress, ProgressBar, reporting_progress
from corral.provider import ProgressReporter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_reports_are_throttled_and_the_final_one_always_arrives() -> None:
    seen: list[Progress] = []
    clock = Clock()
    rep = ProgressReporter("restore", unit="entries", total=1000, callback=seen.append, clock=clock)
    for i in range(1000):
        clock.now = i * 0.001  # one second in all: about ten reports fit
        rep.advance()
    rep.finish()
    rep.finish()  # only once
    assert 9 <= len(seen) <= 12
    assert [p.done for p in seen] == sorted(p.done for p in seen)
    assert seen[0].done == 1  # the first unit shows at once
    assert seen[-1] == Progress("restore", 1000, 1000, "entries", finished=True)
    assert not any(p.finished for p in seen[:-1])


def test_an_unknown_total_ends_at_what_was_done() -> None:
    seen: list[Progress] = []
    rep = ProgressReporter("snapshot", unit="entries", callback=seen.append)
    rep.advance(5)
    rep.finish()
    assert seen[0].total is None
    assert seen[0].fraction is None
    assert seen[-1] == Progress("snapshot", 5, 5, "entries", finished=True)
    assert seen[-1].fraction == 1.0


def test_done_never_goes_back() -> None:
    seen: list[Progress] = []
    rep = ProgressReporter("pull", unit="bytes", callback=seen.append, interval_s=0)
    rep.update(10, 100)
    rep.update(4, 120)
    assert [(p.done, p.total) for p in seen] == [(10, 100), (10, 120)]


def test_a_raising_callback_is_logged_once_and_dropped(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    def bad(progress: Progress) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("observer bug")

    rep = ProgressReporter("snapshot", unit="entries", callback=bad, interval_s=0)
    with caplog.at_level(logging.WARNING, logger="corral.progress"):
        for _ in range(50):
            rep.advance()
        rep.finish()
    assert calls == 1
    assert rep.done == 50
    assert not rep.active
    (record,) = [r for r in caplog.records if r.name == "corral.progress"]
    assert "progress callback failed" in record.getMessage()


def test_without_a_callback_nothing_is_reported() -> None:
    rep = ProgressReporter("snapshot", unit="entries")
    assert not rep.active
    rep.advance(3)
    rep.finish()
    assert rep.done == 3


@pytest.mark.anyio
async def test_the_callback_reaches_worker_threads_of_the_block_only() -> None:
    seen: list[tuple[str, int]] = []

    def work(name: str) -> None:
        rep = ProgressReporter(name, unit="entries")
        rep.advance()
        rep.finish()

    def record(progress: Progress) -> None:
        seen.append((progress.operation, threading.get_ident()))

    with reporting_progress(record):
        assert corral.provider.current_progress_callback() is record
        await anyio.to_thread.run_sync(work, "inside")
        with reporting_progress(None):
            await anyio.to_thread.run_sync(work, "silenced")
    await anyio.to_thread.run_sync(work, "outside")
    assert corral.provider.current_progress_callback() is None
    assert {op for op, _ in seen} == {"inside"}
    assert all(ident != threading.get_ident() for _, ident in seen)


def test_render_shows_a_bar_or_a_counter() -> None:
    from corral._progress_bar import render

    line = render(Progress("restore", 250, 1000, "entries"))
    assert line.startswith("restore [#######---------------------]")
    assert " 25% 250/1000 entries" in line
    assert render(Progress("snapshot", 42, None, "entries")) == "snapshot: 42 entries"
    assert "3.0 MiB/12.0 MiB" in render(Progress("pull", 3 << 20, 12 << 20, "bytes"))


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_draws_in_place_throttled_and_clears_at_the_end() -> None:
    clock = Clock()
    out = Tty()
    bar = ProgressBar(out, clock=clock)
    bar(Progress("restore", 1, 10, "entries"))
    bar(Progress("restore", 2, 10, "entries"))  # too soon: not drawn
    clock.now = 1.0
    bar(Progress("restore", 5, 10, "entries"))
    bar(Progress("restore", 10, 10, "entries", finished=True))
    text = out.getvalue()
    assert text.count("restore [") == 2
    assert " 2/10" not in text
    assert text.endswith("\r\x1b[K")
    bar.clear()  # nothing left to clear: writes nothing
    assert out.getvalue() == text


def test_no_bar_unless_the_stream_is_a_terminal() -> None:
    assert ProgressBar.for_terminal(io.StringIO()) is None
    r, w = os.pipe()
    with os.fdopen(r, "rb") as _reader, os.fdopen(w, "w") as writer:
        assert ProgressBar.for_terminal(writer) is None
    assert isinstance(ProgressBar.for_terminal(Tty()), ProgressBar)
