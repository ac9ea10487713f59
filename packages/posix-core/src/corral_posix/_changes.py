"""A change journal for one workspace tree, kept by the kernel (inotify).

A snapshot or restore that walks the live tree pays one ``stat`` per entry
however little changed: at 100,000 files that walk alone costs a fifth of
``tar xzf`` of the whole tree. With a journal, only the directories where
something happened since the last walk are read.

How it stays sound:

* **Watched before read.** A directory's watch is added (through its open
  fd, never by path) *before* the walk lists it, so a change made after the
  walk read an entry always leaves an event.
* **Conservative events.** Any event in a directory (a child written,
  truncated, closed after writing, its metadata changed, created, deleted or
  renamed) marks that directory for re-reading; a directory created or moved
  in is re-walked whole, and watched as the walk enters it. Nothing an
  event says is trusted beyond "look here again".
* **Anything the journal cannot account for ends it.** A queue overflow, a
  watched directory renamed (its watches would name the wrong paths), the
  root itself moved or deleted, a watch the kernel refuses (the per-user
  limit), an operation that failed half-way: the journal is marked invalid
  and the next operation walks the whole tree, which starts a new journal.
* **What inotify cannot see is checked where it can happen.** Writes
  through a shared writable memory mapping leave no event until the
  mapping's file is released (which leaves ``IN_CLOSE_WRITE``), so a
  journal is used only when the owner can name every process that may
  hold the tree open, and none of them maps a file of the tree's
  filesystem shared and writable (``/proc/<pid>/maps``). A write through a
  hard link whose other name is outside the tree leaves its event outside,
  so the journal is only offered by isolation that makes such links
  impossible (local-sandbox: every other writable mount is a private tmpfs,
  so ``link(2)`` into it fails with ``EXDEV``). Hard links inside the tree are
  handled: a re-read file with several links makes every entry of its inode
  re-read (see :mod:`corral_posix._versions`).

A process holds one inotify instance for all its journals (instances are
a per-user resource, 128 by default) and at most a quarter of the user's
watch limit; past it a journal is refused and its tree walked. A process
that resolves the workspace afresh starts without a journal and walks once.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import struct
import threading
from collections.abc import Callable, Iterable
from typing import Final

import attrs

__all__ = ["ChangeJournal", "Changes", "shared_writable_maps"]

_IN_MODIFY: Final = 0x00000002
_IN_ATTRIB: Final = 0x00000004
_IN_CLOSE_WRITE: Final = 0x00000008
_IN_MOVED_FROM: Final = 0x00000040
_IN_MOVED_TO: Final = 0x00000080
_IN_CREATE: Final = 0x00000100
_IN_DELETE: Final = 0x00000200
_IN_DELETE_SELF: Final = 0x00000400
_IN_MOVE_SELF: Final = 0x00000800
_IN_UNMOUNT: Final = 0x00002000
_IN_Q_OVERFLOW: Final = 0x00004000
_IN_IGNORED: Final = 0x00008000
_IN_ONLYDIR: Final = 0x01000000
_IN_ISDIR: Final = 0x40000000
_IN_NONBLOCK: Final = os.O_NONBLOCK
_IN_CLOEXEC: Final = os.O_CLOEXEC

_WATCH_MASK: Final = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
)
# Not IN_DONT_FOLLOW: the path is /proc/self/fd/N, whose magic link must be
# followed to reach exactly the directory the walk holds open.
_EVENT: Final = struct.Struct("iIII")
_READ_SIZE: Final = 1 << 16


class _Libc:
    """The inotify calls, bound once (``ok`` is False where libc lacks them)."""

    def __init__(self) -> None:
        self.ok = False
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name, use_errno=True)
            self.init1 = libc.inotify_init1
            self.add = libc.inotify_add_watch
            self.rm = libc.inotify_rm_watch
        except (OSError, AttributeError):
            return
        self.init1.argtypes = [ctypes.c_int]
        self.init1.restype = ctypes.c_int
        self.add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.add.restype = ctypes.c_int
        self.rm.argtypes = [ctypes.c_int, ctypes.c_int]
        self.rm.restype = ctypes.c_int
        self.ok = True


def _watch_budget() -> int:
    """How many watches this process may hold: a quarter of the user's limit.

    Watches are a per-user kernel resource other programs of the same user
    (editors, build tools, the init system) need too.
    """
    try:
        with open("/proc/sys/fs/inotify/max_user_watches", encoding="ascii") as fh:
            return max(0, int(fh.read()) // 4)
    except (OSError, ValueError):
        return 8192 // 4


class _Hub:
    """The process's one inotify instance, shared by every journal.

    inotify instances are a scarce per-user resource (128 by default), so
    a process serving hundreds of workspaces holds one instance, not one
    per workspace. Every journal's state is guarded by :attr:`lock`.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.calls: _Libc | None = None
        self.fd = -1
        self.budget = 0
        self.generation = 0
        # wd -> the journals watching that directory, each with its path there
        self.owners: dict[int, dict[ChangeJournal, str]] = {}

    def forked(self) -> None:
        """In a forked child: let go of the parent's instance, ending inherited journals.

        Reading the shared instance would steal the parent's events.
        """
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
        self.lock = threading.RLock()  # another thread may have held it at the fork
        self.fd = -1
        self.owners = {}
        self.generation += 1

    def ready(self) -> bool:
        """Open the instance on first use; False where inotify is unavailable."""
        if self.fd >= 0:
            return True
        if self.calls is None:
            self.calls = _Libc()
        if not self.calls.ok:
            return False
        fd = self.calls.init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return False
        self.fd = fd
        self.budget = _watch_budget()
        return True

    def add(self, journal: ChangeJournal, dir_fd: int, rel: str) -> int | None:
        """Watch a directory for ``journal``; its wd, or None when refused."""
        assert self.calls is not None
        if len(self.owners) >= self.budget:
            return None
        wd: int = self.calls.add(self.fd, f"/proc/self/fd/{dir_fd}".encode(), _WATCH_MASK)
        if wd < 0:
            # ENOSPC (the per-user watch limit), ENOMEM, or the directory went away.
            return None
        mine = self.owners.setdefault(wd, {})
        known = mine.get(journal)
        if known is not None and known != rel:
            return None  # one directory under two paths: a rename the journal missed
        mine[journal] = rel
        return wd

    def release(self, journal: ChangeJournal, wds: Iterable[int]) -> None:
        """Drop ``journal``'s watches; the kernel's go when nobody else holds them."""
        assert self.calls is not None
        for wd in wds:
            mine = self.owners.get(wd)
            if mine is None:
                continue
            mine.pop(journal, None)
            if not mine:
                del self.owners[wd]
                self.calls.rm(self.fd, wd)

    def drain(self) -> None:
        """Read every queued event and hand each to the journals it concerns."""
        while self.fd >= 0:
            try:
                buf = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                return
            pos, end = 0, len(buf)
            while pos < end:
                wd, mask, _cookie, length = _EVENT.unpack_from(buf, pos)
                pos += _EVENT.size
                name = os.fsdecode(buf[pos : pos + length].split(b"\0", 1)[0])
                pos += length
                if mask & _IN_Q_OVERFLOW:
                    for journal in {j for mine in self.owners.values() for j in mine}:
                        journal.invalidate()
                    continue
                mine = self.owners.get(wd)
                if mine is None:
                    continue  # a watch already dropped
                if mask & _IN_IGNORED:
                    del self.owners[wd]  # the kernel removed it (its directory is gone)
                for journal, rel in list(mine.items()):
                    journal._event(wd, rel, mask, name)


_hub = _Hub()
os.register_at_fork(after_in_child=_hub.forked)


@attrs.define
class Changes:
    """Where a tree may differ from the manifest its journal started from.

    Paths are relative to the tree's root, components joined by ``/``
    (``""`` is the root).

    Attributes:
        dirs: Directories whose entries must be read again (something in
            them, or they themselves, changed).
        subtrees: Directories to walk whole (created or moved in since).
    """

    dirs: set[str] = attrs.Factory(set)
    subtrees: set[str] = attrs.Factory(set)


class ChangeJournal:
    """The change journal of one tree (see the module docstring).

    Its operations are serialised by the owner (one snapshot or restore at
    a time); the process-wide event hub may update it from another thread,
    under the hub's lock.

    Args:
        writers: Returns the pids of every process that may hold a file of
            the tree open (None: unknown, so the journal is never trusted).
    """

    def __init__(self, writers: Callable[[], Iterable[int] | None]) -> None:
        self._writers = writers
        self._wds: set[int] = set()
        self._valid = False
        self._pending = Changes()
        self._dev = -1
        self._generation = -1

    @property
    def valid(self) -> bool:
        """Whether every change since the journal's start is accounted for."""
        return self._valid and self._generation == _hub.generation

    def close(self) -> None:
        """Drop the watches (the next walk starts a new journal)."""
        with _hub.lock:
            self._valid = False
            self._pending = Changes()
            if self._generation != _hub.generation:
                self._wds = set()  # the parent's watches, not this process's
            if self._wds:
                _hub.release(self, self._wds)
                self._wds = set()

    def invalidate(self) -> None:
        """Stop trusting the journal until a whole-tree walk starts a new one."""
        self.close()

    def start(self, root_fd: int) -> bool:
        """Begin a new journal before a whole-tree walk (which calls :meth:`watch`).

        Returns:
            False where inotify is unavailable (no journal; walks continue).
        """
        with _hub.lock:
            self.close()
            if not _hub.ready():
                return False
            self._dev = os.fstat(root_fd).st_dev
            self._valid = True
            self._generation = _hub.generation
            return self.watch(root_fd, "")

    def watch(self, dir_fd: int, rel: str) -> bool:
        """Watch a directory the walk is about to list; False ends the journal.

        Added through ``/proc/self/fd`` so the watch lands on the directory
        the walk holds, whatever its path now names.
        """
        with _hub.lock:
            if not self.valid:
                return False
            wd = _hub.add(self, dir_fd, rel)
            if wd is None:
                self.invalidate()
                return False
            self._wds.add(wd)
            return True

    def changes(self) -> Changes | None:
        """What changed since the journal's base, or None (walk the whole tree).

        None means the journal cannot say (never started, overflowed, a
        directory was moved, a process maps a file of the tree writable).
        The changes returned are taken out of the journal (events arriving
        meanwhile collect apart, for the next call): an operation that
        fails before its manifest reflects them must :meth:`invalidate`.
        """
        with _hub.lock:
            if self._ended():
                return None
            try:
                _hub.drain()
            except OSError:
                self.invalidate()
            if self._ended():
                return None
        pids = self._writers()
        if pids is None or shared_writable_maps(pids, self._dev):
            return None  # nothing is taken: the changes stay for the next call
        with _hub.lock:
            if self._ended():  # the hub may have ended it from another thread
                return None
            taken, self._pending = self._pending, Changes()
            return taken

    def _ended(self) -> bool:
        # A call, not an attribute test: another thread's drain may end the journal.
        return not self.valid

    def settle(self) -> None:
        """The tree now equals a manifest in full (a whole walk or restore): drop pending changes.

        The changes read so far described the tree before that manifest;
        events still queued in the kernel (a command writing meanwhile)
        are read next time, so nothing that happened during the operation
        is dropped.
        """
        with _hub.lock:
            self._pending = Changes()

    def _event(self, wd: int, path: str, mask: int, name: str) -> None:
        """One event from the hub (under its lock) about directory ``path``."""
        if mask & (_IN_UNMOUNT | _IN_MOVE_SELF):
            self.invalidate()  # a watched directory renamed: its watches name old paths
            return
        if mask & _IN_IGNORED:
            self._wds.discard(wd)
            if path == "":
                self.invalidate()
            return
        if mask & _IN_DELETE_SELF:
            if path == "":
                self.invalidate()
            return  # its parent reported the deletion
        pending = self._pending
        pending.dirs.add(path)
        if not name:
            return  # the directory itself (its mode or times)
        child = f"{path}/{name}" if path else name
        if mask & _IN_ISDIR:
            if mask & _IN_MOVED_FROM:
                self.invalidate()  # watches below it now name paths that moved
                return
            if mask & (_IN_CREATE | _IN_MOVED_TO):
                pending.subtrees.add(child)
            else:
                pending.dirs.add(child)


def shared_writable_maps(pids: Iterable[int], dev: int) -> bool:
    """Whether any of ``pids`` maps a file of device ``dev`` shared and writable.

    Such writes leave no inotify event until the mapping's file is
    released. A process that vanished meanwhile maps nothing; a process
    whose maps cannot be read is assumed to map something.
    """
    want = f"{os.major(dev):02x}:{os.minor(dev):02x}".encode()
    for pid in pids:
        try:
            with open(f"/proc/{int(pid)}/maps", "rb") as fh:
                for line in fh:
                    fields = line.split(None, 5)
                    perms = fields[1] if len(fields) >= 5 else b""
                    if perms[1:2] == b"w" and perms[3:4] == b"s" and fields[3] == want:
                        return True
        except (FileNotFoundError, ProcessLookupError):
            continue
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                continue
            return True
    return False
