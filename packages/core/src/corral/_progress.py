"""Progress of long operations: a typed report, a callback, and how it reaches the work.

Snapshotting or restoring a big tree and pulling a container image take
seconds to minutes; a caller (a CLI, a notebook, a UI) wants to show how far
along they are. An operation reports :class:`Progress` values to a
:data:`ProgressCallback` through a :class:`ProgressReporter`, which throttles
the reports (at most about ten a second, plus the final one) and guards the
operation against the callback: a callback that raises is logged once and
dropped, never breaking the snapshot or pull it watches.

How the callback reaches the work: a context variable, set around each tool
call by the tool set (``open_workspace(on_progress=...)``) or by the caller
(:func:`reporting_progress`), and read where the operation starts. Why not
the open/resolve path: the callback belongs to a *caller*, not to a
workspace — a workspace is resolved again from a plain ref in another
process, one workspace may serve calls of several observers, and providers
hold no per-session state — and threading a new argument through
``WorkspaceProvider``, ``Snapshotter`` and ``DockerEngine`` would break every
third-party implementation of those protocols. A context variable reaches
exactly the calls made inside the block, including the worker threads they
hop to (anyio copies the context into ``to_thread.run_sync`` on asyncio and
trio alike), and nothing else: no global state. Direct users of a module
pass the callback as a keyword instead (``TmpdirSnapshotter.snapshot(...,
on_progress=cb)``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

import attrs

__all__ = [
    "Progress",
    "ProgressCallback",
    "ProgressReporter",
    "current_progress_callback",
    "reporting_progress",
]

log = logging.getLogger("corral.progress")

REPORT_INTERVAL_S: Final = 0.1
"""Least time between two reports of one operation (the final one is always sent)."""


@attrs.frozen
class Progress:
    """How far one long operation has come.

    Attributes:
        operation: What runs: ``snapshot``, ``restore``, ``branch`` (posix
            versions) or ``pull`` (a container image).
        done: Units done so far; never decreases within one operation.
        total: Units the operation will do, or None while unknown (a
            snapshot cannot know how many entries a tree holds before
            walking it). May grow while known (an image pull learns each
            layer's size when that layer starts downloading).
        unit: What is counted: ``entries`` or ``bytes``.
        finished: This is the operation's last report, sent when it
            completed, with ``done == total``. An operation that fails
            sends no final report (a progress display clears itself on the
            caller's side).
    """

    operation: str
    done: int
    total: int | None
    unit: str
    finished: bool = False

    @property
    def fraction(self) -> float | None:
        """``done / total`` in ``[0, 1]``, or None while the total is unknown."""
        if self.total is None:
            return None
        if self.total <= 0:
            return 1.0
        return min(1.0, self.done / self.total)


ProgressCallback = Callable[[Progress], None]
"""Receives :class:`Progress` reports. Called from the thread doing the work
(often a worker thread, not the event loop's), so it must be quick and
thread-safe; an exception it raises is logged and the callback dropped for
the rest of that operation."""

_CALLBACK: ContextVar[ProgressCallback | None] = ContextVar("corral_progress", default=None)


@contextmanager
def reporting_progress(callback: ProgressCallback | None) -> Iterator[None]:
    """Send progress of the operations started inside the block to ``callback``.

    Covers this task and the worker threads it starts; other tasks and
    threads are unaffected. ``None`` silences reports inside the block.
    """
    token = _CALLBACK.set(callback)
    try:
        yield
    finally:
        _CALLBACK.reset(token)


def current_progress_callback() -> ProgressCallback | None:
    """The callback :func:`reporting_progress` installed here, if any (for module authors)."""
    return _CALLBACK.get()


class ProgressReporter:
    """Throttled, guarded progress of one operation (for module and provider authors).

    Cheap when nobody listens: every method returns at once without a
    callback, so hot loops may call :meth:`advance` per entry.

    Args:
        operation: The operation's name (:attr:`Progress.operation`).
        unit: What is counted (:attr:`Progress.unit`).
        total: Units to do, if known.
        callback: Where reports go (default: :func:`current_progress_callback`).
        interval_s: Least time between two reports.
        clock: Monotonic seconds (a test may pass its own).
    """

    def __init__(
        self,
        operation: str,
        *,
        unit: str,
        total: int | None = None,
        callback: ProgressCallback | None = None,
        interval_s: float = REPORT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.operation = operation
        self.unit = unit
        self.total = total
        self.done = 0
        self._callback = callback if callback is not None else current_progress_callback()
        self._interval = interval_s
        self._clock = clock
        self._next = float("-inf")
        self._finished = False

    @property
    def active(self) -> bool:
        """Whether reports still go anywhere."""
        return self._callback is not None and not self._finished

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more units done; report if the last report is old enough."""
        self.done += n
        if self._callback is not None:
            self._maybe_send()

    def update(self, done: int, total: int | None = None) -> None:
        """Set the units done (a lower value than before is ignored) and the total if known."""
        self.done = max(self.done, done)
        if total is not None:
            self.total = total
        if self._callback is not None:
            self._maybe_send()

    def finish(self) -> None:
        """Send the last report (always, throttling aside); later calls do nothing.

        Its ``total`` is the known total, or ``done`` when the total was never
        known (the walk is over, so what was done is all there was).
        """
        if self._finished:
            return
        self._finished = True
        if self._callback is not None:
            total = self.done if self.total is None else self.total
            self._send(Progress(self.operation, self.done, total, self.unit, finished=True))

    def _maybe_send(self) -> None:
        now = self._clock()
        if now < self._next or self._finished:
            return
        self._next = now + self._interval
        self._send(Progress(self.operation, self.done, self.total, self.unit))

    def _send(self, progress: Progress) -> None:
        callback = self._callback
        if callback is None:
            return
        try:
            callback(progress)
        except Exception:
            # The operation matters more than its observer: drop the callback.
            self._callback = None
            log.warning(
                "progress callback failed; no further %s reports are sent",
                self.operation,
                exc_info=True,
            )
