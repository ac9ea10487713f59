"""Capped capture of a command's output, and feeding its stdin.

The reaper reads the command's pipes and forwards only what fits under the
cap (counting the rest); the host assembles it here.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Callable

import anyio

__all__ = ["Capture", "feed", "truncation_marker", "write_now"]


def truncation_marker(limit: int) -> str:
    """The line appended to a stream that was cut at ``limit`` bytes."""
    return f"\n[... output truncated at {limit} bytes]"


class Capture:
    """Keeps the first ``limit`` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.discarded = 0

    def add(self, chunk: bytes) -> None:
        """Keep what fits under the cap; count the rest as discarded."""
        room = self.limit - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.discarded += max(0, len(chunk) - max(room, 0))

    @property
    def truncated(self) -> bool:
        """Whether any byte was discarded."""
        return self.discarded > 0

    def text(self) -> str:
        """UTF-8 text (invalid bytes replaced) plus the marker when truncated.

        A multi-byte character cut by the cap is dropped rather than shown
        as a replacement character.
        """
        if not self.truncated:
            return self.data.decode("utf-8", "replace")
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        out = decoder.decode(bytes(self.data), final=not self.truncated)
        return out + truncation_marker(self.limit) if self.truncated else out


def write_now(fd: int, data: bytes) -> int:
    """Write what a non-blocking ``fd`` takes without waiting; return the count."""
    written = 0
    view = memoryview(data)
    while written < len(data):
        try:
            written += os.write(fd, view[written:])
        except (BlockingIOError, BrokenPipeError):
            break
    return written


async def feed(fd: int, data: bytes, done: Callable[[], None]) -> None:
    """Write ``data`` to ``fd``, then call ``done`` (which closes it); a
    reader that went away is fine."""
    view = memoryview(data)
    try:
        while view:
            try:
                written = os.write(fd, view)
            except BlockingIOError:
                await anyio.wait_writable(fd)
                continue
            except BrokenPipeError:
                return
            view = view[written:]
    finally:
        done()
