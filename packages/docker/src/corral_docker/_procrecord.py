"""One background process on the host: its live state, and its record in the state directory.

The record is posix-core's format (``meta.json``; ``lock``, flocked while
this program pumps the process; segment files under ``stdout/`` and
``stderr/`` written by posix-core's segment writer; an atomic
``final.json``), so posix-core's reader serves reads, infos and ``lost``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from typing import Any, Final

from corral.provider import ProcessRequest
from corral_posix import remove_tree

# posix-core's record format, segment writer and cursor reader (one implementation).
from corral_posix._processes import _write_json
from corral_posix._prochost import _Log, _write_final
from corral_posix._streamlog import segment_size

from ._attach import AttachedExec

__all__ = [
    "END",
    "STREAMS",
    "LiveProcess",
    "abandon_record",
    "close_record",
    "drain",
    "has_terminal",
    "make_record",
    "open_logs",
]

STREAMS: Final = {"stdout": 0, "stderr": 1}
"""Output streams by name, as indexes of :attr:`LiveProcess.logs`."""
END: Final = 2
"""The waiter index meaning "the process ended"."""
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LiveProcess:
    """A process this program started and still pumps (shared by the pump and callers)."""

    def __init__(
        self, pid: str, record: str, attached: AttachedExec, marker: str, request: ProcessRequest
    ) -> None:
        self.id = pid
        self.record = record
        self.attached = attached
        self.marker = marker
        self.terminal = request.terminal is not None
        self.timeout_s = request.timeout_s
        self.stdin_open = True
        self.reason: str | None = None
        self.ended = False
        self.finished = threading.Event()
        self.writing = threading.Lock()
        self.lock = threading.Lock()
        self.waiters: list[tuple[int, int, socket.socket]] = []
        self.ends = [0, 0]
        self.record_fd = -1
        self.lock_fd = -1
        self.logs: list[_Log] = []

    def add_waiter(self, index: int, cursor: int) -> socket.socket | None:
        """A socket that becomes readable once ``index`` passes ``cursor`` (None: already)."""
        ours, theirs = socket.socketpair()
        with self.lock:
            if self.ended or (index < END and self.ends[index] > cursor):
                ours.close()
                theirs.close()
                return None
            self.waiters.append((index, cursor, theirs))
        ours.setblocking(False)
        return ours

    def notify(self, index: int | None) -> None:
        """Wake the waiters the new bytes of ``index`` (or the end, None) satisfy."""
        with self.lock:
            keep = []
            for waiter in self.waiters:
                stream, cursor, sock = waiter
                if index is None or (stream == index and self.ends[index] > cursor):
                    sock.close()
                else:
                    keep.append(waiter)
            self.waiters = keep


def make_record(records: str, pid: str, request: ProcessRequest) -> tuple[str, int, int]:
    """The record, its directory fd and its ``lock``, flocked before anyone can see it."""
    record = os.path.join(records, pid)
    os.makedirs(records, mode=0o700, exist_ok=True)
    os.mkdir(record, 0o700)
    for stream in STREAMS:
        os.mkdir(os.path.join(record, stream), 0o700)
    record_fd, lock_fd = _open_record(record)
    terminal = request.terminal
    _write_json(
        record,
        "meta.json",
        {
            "id": pid,
            "command": request.command,
            "started_at": time.time(),
            "terminal": None if terminal is None else [terminal.cols, terminal.rows],
            "retained": request.retained_bytes,
        },
    )
    return record, record_fd, lock_fd


def open_logs(live: LiveProcess, retained: int) -> None:
    """Give ``live`` a segment writer per stream, at most ``retained`` bytes on disk each.

    The writer deletes whole old segments (a quarter window each) before a
    new one starts, so between three quarters and all of the window stays
    readable -- the same window as on the POSIX providers.
    """
    live.logs = [
        _Log(_open_dir(live.record, name), retained, segment_size(retained)) for name in STREAMS
    ]


async def drain(live: LiveProcess) -> None:
    """Record the exec's output until its streams end, waking readers as bytes land."""
    while (chunks := await live.attached.receive()) is not None:
        for name, data in chunks:
            index = STREAMS[name]
            live.logs[index].add(data)
            with live.lock:
                live.ends[index] = live.logs[index].end
            live.notify(index)


def has_terminal(record: str) -> bool:
    """Whether the record's process runs on a terminal (its stderr is then empty)."""
    try:
        with open(os.path.join(record, "meta.json"), "rb") as f:
            meta = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and bool(meta.get("terminal"))


def _open_dir(record: str, name: str) -> int:
    return os.open(os.path.join(record, name), _DIR_FLAGS)


def _open_record(record: str) -> tuple[int, int]:
    """The record's directory fd and its flocked ``lock`` (held while the pump lives)."""
    record_fd = os.open(record, _DIR_FLAGS)
    lock_fd = os.open("lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600, dir_fd=record_fd)
    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return record_fd, lock_fd


def close_record(live: LiveProcess, final: dict[str, Any]) -> None:
    """Write the final state atomically, then release the record (and its lock)."""
    for log in live.logs:
        log.close()
        with contextlib.suppress(OSError):
            os.close(log.dir_fd)
    _write_final(live.record_fd, json.dumps(final).encode())
    os.close(live.lock_fd)
    os.close(live.record_fd)


def abandon_record(record: str, record_fd: int, lock_fd: int) -> None:
    """A start that failed before anything ran leaves no record behind."""
    remove_tree(record)
    os.close(lock_fd)
    os.close(record_fd)
