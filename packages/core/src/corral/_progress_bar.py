"""A one-line progress bar on a terminal, fed by :class:`~corral.Progress` reports.

The CLI draws it on stderr only when stderr is a terminal: piped or
redirected output (a log file, CI, another program reading JSON) never gets
carriage returns and escape codes mixed into it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final, TextIO

from ._progress import Progress

__all__ = ["ProgressBar"]

_CLEAR: Final = "\r\x1b[K"
_WIDTH: Final = 28


def _amount(value: int, unit: str) -> str:
    if unit != "bytes":
        return f"{value}"
    size = float(value)
    for suffix in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or suffix == "GiB":
            return f"{size:.0f} {suffix}" if suffix == "B" else f"{size:.1f} {suffix}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def render(progress: Progress, width: int = _WIDTH) -> str:
    """One line describing a report: a bar when the total is known, a counter otherwise."""
    unit = "" if progress.unit == "bytes" else f" {progress.unit}"
    done = _amount(progress.done, progress.unit)
    fraction = progress.fraction
    if fraction is None or progress.total is None:
        return f"{progress.operation}: {done}{unit}"
    filled = int(fraction * width)
    bar = "#" * filled + "-" * (width - filled)
    total = _amount(progress.total, progress.unit)
    return f"{progress.operation} [{bar}] {fraction * 100:3.0f}% {done}/{total}{unit}"


class ProgressBar:
    """Draws progress on one terminal line, redrawn in place and cleared at the end.

    A :data:`~corral.ProgressCallback`: pass it as ``on_progress``. It is
    thread-safe (reports come from worker threads) and throttles its own
    drawing, so a chatty reporter cannot flood the terminal.

    Args:
        stream: Where to draw (a terminal).
        interval_s: Least time between two redraws.
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        interval_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._interval = interval_s
        self._clock = clock
        self._next = float("-inf")
        self._drawn = False
        self._lock = threading.Lock()

    @classmethod
    def for_terminal(cls, stream: TextIO) -> ProgressBar | None:
        """A bar on ``stream`` if it is a terminal, else None (no bar when piped)."""
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError, OSError):
            tty = False
        return cls(stream) if tty else None

    def __call__(self, progress: Progress) -> None:
        """Draw a report (the final report of an operation clears the line)."""
        with self._lock:
            if progress.finished:
                self._clear_locked()
                return
            now = self._clock()
            if now < self._next:
                return
            self._next = now + self._interval
            self._stream.write(_CLEAR + render(progress))
            self._stream.flush()
            self._drawn = True

    def clear(self) -> None:
        """Remove a bar still on the line (an operation that failed before finishing)."""
        with self._lock:
            self._clear_locked()

    def _clear_locked(self) -> None:
        if self._drawn:
            self._stream.write(_CLEAR)
            self._stream.flush()
            self._drawn = False
        self._next = float("-inf")
