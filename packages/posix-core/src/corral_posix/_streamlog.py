"""Reading a process's recorded output: segment files addressed by byte cursor.

The writer is the process host (``_prochost.py``, which cannot import this
package): each stream of a process is a directory of segment files, each
named by the cursor of its first byte (20 decimal digits), contiguous, the
newest one growing. Old segments are deleted whole, so the earliest
readable cursor is the name of the oldest segment, the end is the newest
segment's name plus its size, and a read never needs the writer's help.

Deletion races a reader harmlessly: an open segment stays readable after
it is unlinked, and a segment that vanished between the listing and the
open sends the reader back to the listing, where the cursor is then
either found again or reported as expired.
"""

from __future__ import annotations

import os
from typing import Final

import attrs

from corral.provider import CursorExpiredError, OperationError

__all__ = ["SEGMENT_DIGITS", "StreamExtent", "extent", "read_stream", "segment_size"]

SEGMENT_DIGITS: Final = 20
_MAX_SEGMENT: Final = 16 << 20
_ATTEMPTS: Final = 8
_OPEN: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def segment_size(retained: int) -> int:
    """Segment size for a retained window: a quarter of it (1 byte to 16 MiB).

    A quarter keeps at least three quarters of the window readable just
    after a new segment starts, and costs a file per quarter window.
    """
    return max(1, min(retained // 4, _MAX_SEGMENT))


@attrs.frozen
class StreamExtent:
    """Where a stream's readable bytes lie: ``[start, end)``."""

    start: int
    end: int


def _segments(path: str) -> list[int]:
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if len(n) == SEGMENT_DIGITS and n.isdigit())


def extent(path: str) -> StreamExtent:
    """The readable range of the stream recorded under ``path`` (blocking)."""
    for _ in range(_ATTEMPTS):
        starts = _segments(path)
        if not starts:
            return StreamExtent(0, 0)
        try:
            size = os.stat(os.path.join(path, f"{starts[-1]:0{SEGMENT_DIGITS}d}")).st_size
        except FileNotFoundError:
            continue  # retention overtook us: list again
        return StreamExtent(starts[0], starts[-1] + size)
    raise OperationError("the stream kept changing while it was read", code="failed")


def read_stream(path: str, cursor: int, max_bytes: int) -> tuple[bytes, StreamExtent]:
    """Up to ``max_bytes`` bytes at ``cursor`` and the extent seen (blocking).

    Returns fewer bytes (possibly none) when the stream has no more yet.

    Raises:
        CursorExpiredError: ``cursor`` is before the oldest retained byte.
    """
    for _ in range(_ATTEMPTS):
        starts = _segments(path)
        if not starts:
            return b"", StreamExtent(0, 0)  # nothing produced yet
        if cursor < starts[0]:
            raise CursorExpiredError(
                f"cursor {cursor} is older than the retained output (earliest {starts[0]})",
                earliest=starts[0],
            )
        # The segment holding the cursor: the last one starting at or before it.
        lo, hi = 0, len(starts)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if starts[mid] <= cursor:
                lo = mid
            else:
                hi = mid
        try:
            data, end = _read_from(path, starts, lo, cursor, max_bytes)
        except FileNotFoundError:
            continue
        return data, StreamExtent(starts[0], end)
    raise OperationError("the stream kept changing while it was read", code="failed")


def _read_from(
    path: str, starts: list[int], index: int, cursor: int, max_bytes: int
) -> tuple[bytes, int]:
    """Read across segments from ``starts[index]``; return the bytes and the end seen."""
    pieces: list[bytes] = []
    want = max_bytes
    end = cursor
    for i in range(index, len(starts)):
        fd = os.open(os.path.join(path, f"{starts[i]:0{SEGMENT_DIGITS}d}"), _OPEN)
        try:
            size = os.fstat(fd).st_size
            seg_end = starts[i] + size
            end = max(end, seg_end)
            offset = cursor - starts[i]
            if want > 0 and offset < size:
                data = os.pread(fd, min(want, size - offset), offset)
                pieces.append(data)
                want -= len(data)
                cursor += len(data)
        finally:
            os.close(fd)
        last = i == len(starts) - 1
        if want <= 0 or last or cursor < seg_end:
            if last:
                break
            # Later segments exist: the stream's end is at least the next start.
            end = max(end, starts[-1])
            break
    return b"".join(pieces), end
