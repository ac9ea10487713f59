"""Walking a live tree into a manifest, and bringing a tree to a manifest by difference.

Both walks are iterative and fd-based (:class:`~corral_posix._fdtree.DirChain`):
one directory fd below the top at any depth, every entry acted on by name
relative to its directory fd, symlinks never followed (``O_NOFOLLOW``), so
a command that swaps a directory for a symlink mid-walk redirects nothing.

:func:`scan` reads only what changed: an entry whose
``(st_mode, dev, ino, size, mtime_ns, ctime_ns)`` equals the previous
manifest's record at the same path keeps its hash, and a directory whose
whole listing equals the records of its entries is taken over in bulk (a
few C-level list operations instead of Python work per entry: at 100,000
files the stat walk itself is what remains). Entries touched too close to
a scan (timestamps have a clock tick of granularity) get no record and are
read again next time, as git does with "racily clean" entries.

:func:`apply` makes the tree under a directory fd equal a manifest,
touching only what differs: a directory whose listing equals the index's
records and whose recorded content equals the target's is only descended;
elsewhere extra entries are removed, missing and changed files are written
to an ``O_EXCL`` temp file in their directory (content verified against its
hash while copied) and renamed over, modes fixed, symlinks recreated as
data. Directory modes are set when the walk leaves the directory, so a
read-only directory still receives its entries. A branch (``fresh``) writes
straight under the final names of a tree nobody else sees yet, and hands
directories of large files to a second thread (:class:`_Spread`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import logging
import operator
import os
import secrets
import stat
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final

import attrs

from corral.provider import OperationError, ProgressReporter

from ._blobstore import BlobError, BlobStore
from ._changes import Changes
from ._fdtree import DirChain, _enter, remove_tree_at
from ._manifest import NO_CHILDREN, Key, Manifest, key_of, kind_of

__all__ = ["Caps", "Stale", "Watch", "apply", "apply_changes", "scan", "scan_changes"]

log = logging.getLogger("corral.posix.versions")

_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_SMALL: Final = 1 << 20
_NLINK: Final = operator.attrgetter("st_nlink")
RACY_NS: Final = 100_000_000
"""An entry whose mtime or ctime is this close to (or after) the scan that
recorded it is hashed again next time: the kernel's timestamp clock ticks
coarsely, so a later write could carry the same times."""


@attrs.frozen
class Caps:
    """Bounds on one version: a snapshot over them fails, a restore bomb is refused."""

    max_entries: int = 1_000_000
    max_bytes: int = 20 * 1024**3
    max_file_bytes: int = 2 * 1024**3


class Watch:
    """Where a journal-keeping walk reports each directory before listing it.

    Args:
        add: Called with the directory's fd (borrowed) and its path
            relative to the root (``""`` for the root).

    Attributes:
        links: Gets an entry when a walked directory holds a regular file
            with more than one link.
    """

    def __init__(self, add: Callable[[int, str], object]) -> None:
        self._add = add
        self.links: list[bool] = []

    def __call__(self, dir_fd: int, rel: str) -> None:
        self._add(dir_fd, rel)


class Stale(Exception):
    """The tree does not look as the change journal says: walk it whole instead."""


def _too_large(what: str) -> OperationError:
    return OperationError(
        f"the workspace holds more than {what}; it cannot be snapshotted", code="too_large"
    )


def _listing(fd: int, links: list[bool] | None = None) -> tuple[list[str], list[Key]]:
    """Names and :data:`Key` s of a directory's entries, in listing order.

    One ``fstatat`` per entry relative to the directory fd, never following
    a link, and no Python-level loop: the names and keys come out as two
    lists built in C, which the walks compare with stored columns as whole
    slices. (``listdir`` plus ``os.stat`` costs about a third less than
    ``scandir``'s ``DirEntry`` objects and their ``stat()``.) Entries that
    vanish meanwhile are left out.

    Args:
        fd: The directory (borrowed).
        links: When given, ``True`` is appended if a regular file in the
            directory has more than one link (a change journal cannot
            follow writes through another name).
    """
    names = os.listdir(fd)
    lstat = functools.partial(os.stat, dir_fd=fd, follow_symlinks=False)
    try:
        stats = list(map(lstat, names))
    except FileNotFoundError:
        found, stats = [], []
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                stats.append(lstat(name))
                found.append(name)
        names = found
    if (
        links is not None
        and max(map(_NLINK, stats), default=1) > 1
        and any(st.st_nlink > 1 and stat.S_ISREG(st.st_mode) for st in stats)
    ):
        links.append(True)
    return names, list(map(key_of, stats))


def _same_span(m: Manifest, idx: int, names: list[str], keys: list[Key]) -> tuple[int, int] | None:
    """The span of ``m``'s directory ``idx`` when it records exactly this listing, in order."""
    span = m.span(idx)
    if span is None:
        return None
    start, end = span
    if end - start != len(names) or keys != m.key[start:end] or names != m.name[start:end]:
        return None
    return span


def _hash_file(
    dir_fd: int, name: str, blobs: BlobStore | None, caps: Caps
) -> tuple[str, int, Key | None] | None:
    """Read and hash one file (storing it); ``(digest, size, key)`` or None if not a file now.

    The key is the opened file's own (not the listing's), and None when the
    file changed while it was read.
    """
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            return None
        if before.st_size > caps.max_file_bytes:
            raise _too_large(f"a file of {caps.max_file_bytes} bytes")
        data = os.read(fd, _SMALL + 1) if before.st_size <= _SMALL else b""
        while data and len(data) <= _SMALL and (more := os.read(fd, _SMALL + 1 - len(data))):
            data += more
        if before.st_size > _SMALL or len(data) > _SMALL:
            os.lseek(fd, 0, os.SEEK_SET)
            digest, size = _stream_hash(fd, blobs)
        else:
            digest, size = hashlib.sha256(data).hexdigest(), len(data)
            if blobs is not None:
                blobs.put(digest, data)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    key = key_of(before)
    stable = key == key_of(after) and size == before.st_size
    return digest, size, key if stable else None


def _stream_hash(fd: int, blobs: BlobStore | None) -> tuple[str, int]:
    if blobs is not None:
        digest, size, _new = blobs.put_fd(fd)
        return digest, size
    hasher = hashlib.sha256()
    size = 0
    while chunk := os.read(fd, _SMALL):
        hasher.update(chunk)
        size += len(chunk)
    return hasher.hexdigest(), size


def _signature(m: Manifest, kids: dict[str, int]) -> dict[str, Key | None]:
    """Name -> recorded key of a directory's entries (C-level passes)."""
    return dict(zip(kids.keys(), map(m.key.__getitem__, kids.values()), strict=True))


def _content(m: Manifest, kids: dict[str, int]) -> dict[str, tuple[str, int, str]]:
    """Name -> (kind, mode, data) of a directory's entries (C-level passes)."""
    idxs = kids.values()
    return dict(
        zip(
            kids.keys(),
            zip(
                map(m.kind.__getitem__, idxs),
                map(m.mode.__getitem__, idxs),
                map(m.data.__getitem__, idxs),
                strict=True,
            ),
            strict=True,
        )
    )


class _Scan:
    """State of one :func:`scan`: the new manifest's columns, built directory by directory."""

    def __init__(
        self, prev: Manifest | None, blobs: BlobStore | None, caps: Caps, scan_ns: int
    ) -> None:
        self.prev = prev
        self.blobs = blobs
        self.caps = caps
        self.trust = scan_ns - RACY_NS
        self.m = Manifest()
        self.spans: list[tuple[int, int]] = []
        self.total = 0
        self.skipped: list[str] = []
        self.dropped: list[int] = []
        self.links: list[bool] | None = None

    def add(  # noqa: PLR0917 -- one positional slot per manifest column
        self, parent: int, name: str, kind: str, mode: int, size: int, data: str, key: Key | None
    ) -> int:
        m = self.m
        m.parent.append(parent)
        m.name.append(name)
        m.kind.append(kind)
        m.mode.append(mode & 0o777)
        m.size.append(size)
        m.data.append(data)
        m.key.append(key)
        self.spans.append(NO_CHILDREN)
        return len(m.parent) - 1

    def record(self, key: Key | None) -> Key | None:
        """The key to keep: None when the entry changed too close to this scan to be trusted."""
        if key is None or key[4] >= self.trust or key[5] >= self.trust:
            return None
        return key

    def directory(self, fd: int, me: int, old: int, base: str) -> list[tuple[str, int, int]]:
        """Record one directory's entries; return its subdirectories ``(name, new, old)``."""
        names, keys = _listing(fd, self.links)
        prev = self.prev
        if len(self.m.parent) + len(names) > self.caps.max_entries:
            raise _too_large(f"{self.caps.max_entries} entries")
        prev_kids = None
        if prev is not None and old >= 0:
            span = _same_span(prev, old, names, keys)
            if span is not None:
                return self._take_over(prev, span, me)
            prev_kids = prev.children(old)
        start = len(self.m.parent)
        subdirs: list[tuple[str, int, int]] = []
        for name, key in zip(names, keys, strict=True):
            kind = kind_of(key[0])
            if kind is None:
                self.skipped.append(f"{base}/{name}")
                continue
            was = prev_kids.get(name, -1) if prev_kids is not None else -1
            same = was >= 0 and prev is not None and prev.key[was] == key
            mode = stat.S_IMODE(key[0])
            if kind == "d":
                idx = self.add(me, name, "d", mode, 0, "", self.record(key))
                sub = was if was >= 0 and prev is not None and prev.kind[was] == "d" else -1
                subdirs.append((name, idx, sub))
            elif kind == "l":
                if same and prev is not None:
                    target, size = prev.data[was], prev.size[was]
                else:
                    try:
                        target = os.readlink(name, dir_fd=fd)
                    except OSError:
                        self.skipped.append(f"{base}/{name}")
                        continue
                    size = len(os.fsencode(target))
                self.add(me, name, "l", 0o777, size, target, self.record(key))
            else:
                got: tuple[str, int, Key | None] | None
                if same and prev is not None:
                    got = prev.data[was], prev.size[was], key
                else:
                    got = _hash_file(fd, name, self.blobs, self.caps)
                    if got is None:
                        self.skipped.append(f"{base}/{name}")
                        continue
                digest, size, got_key = got
                self.total += size
                if self.total > self.caps.max_bytes:
                    raise _too_large(f"{self.caps.max_bytes} bytes")
                self.add(me, name, "f", mode, size, digest, self.record(got_key))
        self.spans[me] = (start, len(self.m.parent))
        return subdirs

    def _take_over(
        self, prev: Manifest, span: tuple[int, int], me: int
    ) -> list[tuple[str, int, int]]:
        """Copy an unchanged directory's entries from the previous manifest, as slices."""
        m = self.m
        first, end = span
        n = end - first
        start = len(m.parent)
        kinds = prev.kind[first:end]
        sizes = prev.size[first:end]
        # Directories have size 0; a symlink's size is its target's length, not content.
        self.total += sum(sizes)
        if "l" in kinds:
            self.total -= sum(s for s, k in zip(sizes, kinds, strict=True) if k == "l")
        if self.total > self.caps.max_bytes:
            raise _too_large(f"{self.caps.max_bytes} bytes")
        names = prev.name[first:end]
        m.parent.extend([me] * n)
        m.name.extend(names)
        m.kind.extend(kinds)
        m.mode.extend(prev.mode[first:end])
        m.size.extend(sizes)
        m.data.extend(prev.data[first:end])
        m.key.extend(prev.key[first:end])
        self.spans.extend([NO_CHILDREN] * n)
        self.spans[me] = (start, start + n)
        if "d" not in kinds:
            return []
        return [(names[j], start + j, first + j) for j, k in enumerate(kinds) if k == "d"]

    def finish(self) -> Manifest:
        """The manifest, without the directories that vanished before they could be entered."""
        m = self.m
        m._spans = self.spans
        if not self.dropped:
            m._file_bytes = self.total
            return m
        gone = set(self.dropped)
        keep = [i for i in range(len(m.parent)) if i not in gone]
        remap = {old: new for new, old in enumerate(keep)}
        out = Manifest()
        out.parent = [remap.get(m.parent[i], -1) if i else -1 for i in keep]
        for column in ("name", "kind", "mode", "size", "data", "key"):
            values = getattr(m, column)
            setattr(out, column, [values[i] for i in keep])
        return out


def scan(
    root_fd: int,
    prev: Manifest | None,
    blobs: BlobStore | None,
    caps: Caps,
    scan_ns: int,
    *,
    progress: ProgressReporter | None = None,
    watch: Watch | None = None,
) -> tuple[Manifest, list[str]]:
    """The manifest of the tree under ``root_fd``; changed files stored in ``blobs``.

    A directory whose live listing (names and keys) equals what ``prev``
    recorded for it is taken over in bulk; other directories are compared
    entry by entry and only entries whose key differs are read.

    Args:
        root_fd: The workspace root (borrowed).
        prev: The previous manifest of this workspace, for change detection.
        blobs: Where new content goes; None only hashes (``diff`` against now).
        caps: Entry and byte caps.
        scan_ns: When this scan started (``time.time_ns()`` taken before
            it): keys of entries changed within :data:`RACY_NS` of it are
            not kept, so the next scan reads them again.
        progress: Advanced once per entry walked (kept or skipped); its
            total stays as given (None: a tree's size is unknown until walked).
            The caller finishes it.
        watch: Called with each directory's fd and relative path before
            the directory is listed (a change journal starting); the scan
            then also notes whether the tree holds hard-linked files
            (``watch.links``).

    Returns:
        The manifest and the paths skipped (special files, entries that
        vanished or turned into something else mid-walk).

    Raises:
        OperationError: ``too_large`` over a cap.
    """
    sc = _Scan(prev, blobs, caps, scan_ns)
    sc.add(-1, "", "d", stat.S_IMODE(os.fstat(root_fd).st_mode), 0, "", None)
    if watch is not None:
        sc.links = watch.links
        watch(root_fd, "")
    chain = DirChain(root_fd)
    # levels: (path of the directory, its subdirectories still to enter)
    first = sc.directory(root_fd, 0, 0 if prev is not None else -1, "")
    levels: list[tuple[str, list[tuple[str, int, int]]]] = [("", first[::-1])]
    if progress is not None:
        progress.advance(len(sc.m.parent) - 1)
    try:
        while levels:
            base, pending = levels[-1]
            if not pending:
                levels.pop()
                if levels:
                    chain.ascend()
                continue
            name, idx, old = pending.pop()
            path = f"{base}/{name}"
            outcome = _enter(chain, name)
            if outcome != "entered":
                sc.skipped.append(path)
                sc.dropped.append(idx)
                continue
            if watch is not None:
                watch(chain.fd, path[1:])
            before = len(sc.m.parent)
            subdirs = sc.directory(chain.fd, idx, old, path)
            if progress is not None:
                progress.advance(len(sc.m.parent) - before)
            levels.append((path, subdirs[::-1]))
    finally:
        chain.close()
    if sc.skipped:
        log.warning(
            "snapshot: skipped %d special or vanished entries: %s",
            len(sc.skipped),
            ", ".join(sc.skipped[:20]),
        )
    return sc.finish(), sc.skipped


class _Applier:
    """State of one :func:`apply` walk."""

    def __init__(
        self,
        target: Manifest,
        index: Manifest | None,
        blobs: BlobStore,
        label: str,
        owner: tuple[int, int] | None = None,
        *,
        progress: ProgressReporter | None = None,
        fresh: bool = False,
    ) -> None:
        self.t = target
        self.fresh = fresh
        self.umask = _umask() if fresh else None
        self.progress = progress
        self.index = index
        self.blobs = blobs
        self.label = label
        self.owner = owner
        self.changed = 0
        self.links: list[bool] | None = None
        self.written: set[str] | None = None
        self.spread: _Spread | None = None

    def note(self, name: str) -> None:
        """Count an entry changed (and remember its name when asked to)."""
        self.changed += 1
        if self.written is not None:
            self.written.add(name)

    def own(self, dir_fd: int, name: str) -> None:
        """Hand an entry this walk created to the tree's owner (never following a link)."""
        if self.owner is not None:
            os.chown(name, *self.owner, dir_fd=dir_fd, follow_symlinks=False)

    def fail(self, idx: int, exc: BlobError) -> OperationError:
        return OperationError(
            f"version {self.label}: the stored content of {self.t.path(idx)} is {exc.reason}; "
            "it was not restored",
            code="failed",
        )

    def write_file(self, dir_fd: int, name: str, idx: int) -> None:
        tmp = f".corral-restore-{secrets.token_hex(8)}.tmp"
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=dir_fd,
        )
        try:
            try:
                self.blobs.copy_verified(self.t.data[idx], fd, self.t.size[idx])
                if self.owner is not None:
                    os.fchown(fd, *self.owner)
                os.fchmod(fd, self.t.mode[idx])
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BlobError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise self.fail(idx, exc) from None
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        self.note(name)

    def file_matches(self, dir_fd: int, name: str, key: Key, idx: int, old: int) -> bool:
        index = self.index
        if index is not None and old >= 0 and index.key[old] is not None and index.key[old] == key:
            return index.data[old] == self.t.data[idx]
        if key[3] != self.t.size[idx]:
            return False
        got = _hash_file(dir_fd, name, None, Caps())
        return got is not None and got[0] == self.t.data[idx]

    def create_file(self, dir_fd: int, name: str, idx: int) -> None:
        """Write a file of a branch straight under its name (the tree is new and unseen)."""
        mode = self.t.mode[idx]
        fd = os.open(
            name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            mode,
            dir_fd=dir_fd,
        )
        try:
            self.blobs.copy_verified(self.t.data[idx], fd, self.t.size[idx])
            if self.owner is not None:
                os.fchown(fd, *self.owner)
            if self.umask is None or mode & self.umask:
                os.fchmod(fd, mode)  # the umask took bits the version holds
        except BlobError as exc:
            raise self.fail(idx, exc) from None
        finally:
            os.close(fd)


def _umask() -> int | None:
    """The process umask, read without changing it (``os.umask`` would, for every thread).

    None where ``/proc`` does not say (then every created file is chmod'ed).
    """
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _chmod_entry(dir_fd: int, name: str, mode: int) -> None:
    """chmod a regular file by name without following a symlink swapped in."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def apply(
    root_fd: int,
    target: Manifest,
    index: Manifest | None,
    blobs: BlobStore,
    label: str,
    *,
    owner: tuple[int, int] | None = None,
    progress: ProgressReporter | None = None,
    fresh: bool = False,
) -> int:
    """Make the tree under ``root_fd`` equal ``target``; return how many entries changed.

    Args:
        root_fd: The tree to change (borrowed); an empty directory for a branch.
        target: The version to bring back (already validated).
        index: The latest manifest of this tree, whose keys let unchanged
            files be recognised without reading them (None: read to compare).
        blobs: Where the target's content is.
        label: The version id, named in errors.
        owner: ``(uid, gid)`` every file, directory and symlink the walk
            creates is given to before it becomes visible under its name
            (docker's container user, when the host writes as root); None
            keeps the writer's.
        progress: Advanced once per entry of ``target`` below the root as
            its directory is brought in line, so it reaches
            ``len(target) - 1`` when the walk completes. The caller sets its
            total and finishes it.
        fresh: ``root_fd`` is an empty directory nobody else uses yet (a
            branch): entries are created without comparing and files are
            written straight under their names; on failure the caller
            removes the whole tree.

    Raises:
        OperationError: A stored blob is missing or corrupt (nothing was
            written from it), or the tree cannot be changed.
    """
    ap = _Applier(target, index, blobs, label, owner, progress=progress, fresh=fresh)
    if fresh and hasattr(blobs, "write_files") and _cpus() > 1:
        ap.spread = _Spread()
    chain = DirChain(root_fd)
    try:
        _apply_walk(ap, chain, index is not None)
    except BaseException:
        if ap.spread is not None:
            ap.spread.close(cancel=True)  # nothing may write into the tree being discarded
        raise
    else:
        if ap.spread is not None:
            ap.spread.close(cancel=False)  # raises what a handed-over directory raised
    finally:
        chain.close()
    return ap.changed


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _Spread:
    """A new tree's directories of large files, filled on a second thread as the walk goes on.

    Copying a large file is one long system call, during which the GIL is
    free, so two threads copy on two cores (git's parallel checkout, in one
    process). Small files are not handed over: between their short calls
    the threads would pass the GIL back and forth more than they work.
    The walk hands a directory over while fewer than two wait, and
    otherwise writes it itself, so neither thread idles; only directories
    the walk leaves writable are handed over (a late file could be refused
    by one it made read-only).
    """

    # A directory is handed over when its files hold this much on average
    # and in all. Measured on 2 cores, 1000 files: at about 32 KiB a file
    # (written from remembered bytes, short calls) two threads were 15%
    # slower than one; at 48 KiB 15% faster; at 100 KiB 28% faster.
    large_file: Final = 48 << 10
    worth_it: Final = 1 << 20

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="corral-branch")
        self.jobs: list[Future[None]] = []

    def take(self, ap: _Applier, dir_fd: int, t_dir: int, files: list[tuple[str, int]]) -> bool:
        """Hand ``files`` of the directory at ``dir_fd`` (borrowed) over, if worth it."""
        t = ap.t
        if t.mode[t_dir] & 0o300 != 0o300:
            return False
        total = sum(t.size[idx] for _name, idx in files)
        if total < self.worth_it or total < self.large_file * len(files) or self._busy():
            return False
        own_fd = os.dup(dir_fd)
        try:
            self.jobs.append(self.pool.submit(_create_files_closing, ap, own_fd, files))
        except BaseException:
            os.close(own_fd)
            raise
        return True

    def _busy(self) -> bool:
        still: list[Future[None]] = []
        for job in self.jobs:
            if job.done():
                job.result()  # a failed directory stops the walk at once
            else:
                still.append(job)
        self.jobs = still
        return len(still) >= 2

    def close(self, *, cancel: bool) -> None:
        """Wait for every job; with ``cancel``, drop those not started and raise nothing."""
        self.pool.shutdown(wait=True, cancel_futures=cancel)
        if not cancel:
            for job in self.jobs:
                job.result()


def _create_files_closing(ap: _Applier, dir_fd: int, files: list[tuple[str, int]]) -> None:
    try:
        _create_files(ap, dir_fd, files)
    finally:
        os.close(dir_fd)


def _apply_walk(ap: _Applier, chain: DirChain, indexed: bool) -> None:
    target = ap.t
    if stat.S_IMODE(os.fstat(chain.fd).st_mode) & 0o700 != 0o700:
        os.fchmod(chain.fd, 0o700)
    # levels: (target dir index, index dir index or -1, subdirectories still to enter)
    levels: list[tuple[int, int, list[tuple[str, int, int]]]] = [
        (0, 0 if indexed else -1, _apply_dir(ap, chain.fd, 0, 0 if indexed else -1))
    ]
    while levels:
        t_dir, _i_dir, pending = levels[-1]
        if pending:
            name, t_idx, i_idx = pending.pop()
            outcome = _enter(chain, name)
            if outcome != "entered":
                raise OperationError(
                    "the workspace changed while it was being restored; try again",
                    code="failed",
                )
            if stat.S_IMODE(os.fstat(chain.fd).st_mode) & 0o700 != 0o700:
                os.fchmod(chain.fd, 0o700)
            levels.append((t_idx, i_idx, _apply_dir(ap, chain.fd, t_idx, i_idx)))
            continue
        levels.pop()
        want = target.mode[t_dir]
        if stat.S_IMODE(os.fstat(chain.fd).st_mode) != want:
            os.fchmod(chain.fd, want)
            ap.changed += 1
        if levels:
            chain.ascend()


def _apply_dir(ap: _Applier, dir_fd: int, t_dir: int, i_dir: int) -> list[tuple[str, int, int]]:
    """Fix the entries of one directory; return its subdirectories to enter."""
    t = ap.t
    if ap.fresh:
        want = t.children(t_dir)
        if ap.progress is not None:
            ap.progress.advance(len(want))
        return _fill_dir(ap, dir_fd, t_dir, want)
    names, keys = _listing(dir_fd, ap.links)
    if ap.index is not None and i_dir >= 0:
        quick = _unchanged_dir(t, t_dir, ap.index, i_dir, (names, keys))
        if quick is not None:
            if ap.progress is not None:
                ap.progress.advance(len(names))
            return quick
    return _fix_dir(ap, dir_fd, t_dir, i_dir, dict(zip(names, keys, strict=True)))


def _fix_dir(
    ap: _Applier, dir_fd: int, t_dir: int, i_dir: int, have: dict[str, Key]
) -> list[tuple[str, int, int]]:
    """Compare one directory's live entries (``have``) with the target by name and fix them."""
    t = ap.t
    want = t.children(t_dir)
    if ap.progress is not None:
        ap.progress.advance(len(want))
    index = ap.index
    idx_kids = index.children(i_dir) if index is not None and i_dir >= 0 else {}
    if (
        index is not None
        and len(have) == len(idx_kids) == len(want)
        and have == _signature(index, idx_kids)
        and _content(index, idx_kids) == _content(t, want)
    ):
        # The directory is as the index recorded it, and that is the target: only descend.
        return [(name, i, idx_kids[name]) for name, i in want.items() if t.kind[i] == "d"]
    for name in have.keys() - want.keys():
        remove_tree_at(dir_fd, name)
        ap.note(name)
    subdirs: list[tuple[str, int, int]] = []
    for name, idx in want.items():
        kind = t.kind[idx]
        key = have.get(name)
        old = idx_kids.get(name, -1)
        if key is not None and kind_of(key[0]) != kind:
            remove_tree_at(dir_fd, name)
            ap.note(name)
            key = None
        if kind == "d":
            if key is None:
                os.mkdir(name, 0o700, dir_fd=dir_fd)
                ap.own(dir_fd, name)
                ap.note(name)
            sub = old if old >= 0 and index is not None and index.kind[old] == "d" else -1
            subdirs.append((name, idx, sub))
        elif kind == "l":
            if key is not None:
                try:
                    same = os.readlink(name, dir_fd=dir_fd) == t.data[idx]
                except OSError:
                    same = False
                if same:
                    continue
                os.unlink(name, dir_fd=dir_fd)
            os.symlink(t.data[idx], name, dir_fd=dir_fd)
            ap.own(dir_fd, name)
            ap.note(name)
        elif key is None or not ap.file_matches(dir_fd, name, key, idx, old):
            ap.write_file(dir_fd, name, idx)
        elif stat.S_IMODE(key[0]) != t.mode[idx]:
            try:
                _chmod_entry(dir_fd, name, t.mode[idx])
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise
                ap.write_file(dir_fd, name, idx)
            ap.note(name)
    return subdirs


def _unchanged_dir(
    t: Manifest, t_dir: int, index: Manifest, i_dir: int, live: tuple[list[str], list[Key]]
) -> list[tuple[str, int, int]] | None:
    """Subdirectories to enter, if the directory is as the index recorded it and that is the target.

    Slice comparisons of whole columns (the live listing's names and keys
    against the index's, then the index's kinds, modes and content against
    the target's): no Python work per entry. None when anything differs
    (or the entries are not in recorded order): the caller compares by name.
    """
    names, keys = live
    if _same_span(index, i_dir, names, keys) is None:
        return None
    return _same_dir(index, i_dir, t, t_dir)


def _fill_dir(
    ap: _Applier, dir_fd: int, t_dir: int, want: dict[str, int]
) -> list[tuple[str, int, int]]:
    """Create every entry of a directory of a new tree (a branch): nothing to compare."""
    t = ap.t
    subdirs: list[tuple[str, int, int]] = []
    files = [(name, idx) for name, idx in want.items() if t.kind[idx] == "f"]
    if files:
        ap.changed += len(files)
        if ap.spread is None or not ap.spread.take(ap, dir_fd, t_dir, files):
            _create_files(ap, dir_fd, files)
    for name, idx in want.items():
        kind = t.kind[idx]
        if kind == "f":
            continue
        if kind == "d":
            os.mkdir(name, 0o700, dir_fd=dir_fd)
            subdirs.append((name, idx, -1))
        else:
            os.symlink(t.data[idx], name, dir_fd=dir_fd)
        ap.own(dir_fd, name)
        ap.changed += 1
    return subdirs


def _create_files(ap: _Applier, dir_fd: int, files: list[tuple[str, int]]) -> None:
    """Write a new directory's files: in one tight loop where the store offers one."""
    t = ap.t
    write_files = getattr(ap.blobs, "write_files", None)
    if write_files is None:
        for name, idx in files:
            ap.create_file(dir_fd, name, idx)
        return
    entries = [(name, t.data[idx], t.size[idx], t.mode[idx]) for name, idx in files]
    try:
        write_files(dir_fd, entries, umask=ap.umask, owner=ap.owner)
    except BlobError as exc:
        raise ap.fail(files[exc.entry][1] if exc.entry >= 0 else files[0][1], exc) from None


class _Follow:
    """A :class:`DirChain` moved lazily to the directories a journal-driven walk reads.

    The walk visits directories depth-first; the chain follows it only
    where a directory must be opened, so an untouched subtree costs no
    system call and reaching a directory costs one ``openat`` per level
    not already held.
    """

    def __init__(self, root_fd: int) -> None:
        self.chain = DirChain(root_fd)
        self.at: list[str] = []

    def go(self, parts: tuple[str, ...]) -> int:
        """The fd of the directory at ``parts`` (borrowed until the next call).

        Raises:
            Stale: A directory on the way is gone, not a directory, or not
                enterable.
        """
        at, chain = self.at, self.chain
        common = 0
        while common < len(at) and common < len(parts) and at[common] == parts[common]:
            common += 1
        while len(at) > common:
            chain.ascend()
            at.pop()
        for name in parts[common:]:
            try:
                outcome = chain.descend(name)
            except OSError:
                raise Stale from None
            if outcome != "entered":
                raise Stale
            at.append(name)
        return chain.fd

    def close(self) -> None:
        self.chain.close()


def scan_changes(
    root_fd: int,
    base: Manifest,
    changes: Changes,
    *,
    blobs: BlobStore | None,
    caps: Caps,
    scan_ns: int,
    watch: Watch,
    progress: ProgressReporter | None = None,
) -> tuple[Manifest, list[str]]:
    """:func:`scan`, reading only the directories a change journal names.

    ``base`` is the manifest the tree equalled when its journal last
    committed; directories outside ``changes`` are taken over from it
    without a system call, the named ones are read as :func:`scan` reads
    them (keys compared, changed files hashed), and new or moved-in
    directories are walked whole and watched.

    Raises:
        Stale: The tree does not match the journal (a directory it keeps
            is gone) or a read directory holds a hard-linked file (whose
            other names the journal cannot follow): scan the whole tree.
        OperationError: ``too_large`` over a cap.
    """
    sc = _Scan(base, blobs, caps, scan_ns)
    sc.links = watch.links
    sc.add(-1, "", "d", stat.S_IMODE(os.fstat(root_fd).st_mode), 0, "", None)
    follow = _Follow(root_fd)
    # (path components, new index, base index or -1, walk the whole subtree)
    stack: list[tuple[tuple[str, ...], int, int, bool]] = [((), 0, 0, False)]
    try:
        while stack:
            parts, me, old, whole = stack.pop()
            rel = "/".join(parts)
            whole = whole or old < 0 or rel in changes.subtrees
            before = len(sc.m.parent)
            if whole or rel in changes.dirs:
                fd = follow.go(parts)
                watch(fd, rel)
                subdirs = sc.directory(fd, me, old, "/" + rel if rel else "")
                if watch.links:
                    raise Stale
            else:
                span = base.span(old)
                if span is None:
                    raise Stale
                subdirs = sc._take_over(base, span, me)
            if progress is not None:
                progress.advance(len(sc.m.parent) - before)
            stack.extend(((*parts, name), idx, sub, whole) for name, idx, sub in reversed(subdirs))
    finally:
        follow.close()
    return sc.finish(), sc.skipped


def _same_dir(a: Manifest, i: int, b: Manifest, j: int) -> list[tuple[str, int, int]] | None:
    """``b``'s subdirectories paired with ``a``'s, when the two directories hold the same entries.

    Same names, kinds, modes and content, in the same order (whole-slice
    comparisons); None when anything differs or a span is unknown.
    """
    sa, sb = a.span(i), b.span(j)
    if sa is None or sb is None:
        return None
    p, q = sa
    r, t = sb
    names = b.name[r:t]
    if (
        q - p != t - r
        or a.name[p:q] != names
        or a.data[p:q] != b.data[r:t]
        or a.kind[p:q] != b.kind[r:t]
        or a.mode[p:q] != b.mode[r:t]
    ):
        return None
    kinds = b.kind[r:t]
    if "d" not in kinds:
        return []
    return [(names[k], r + k, p + k) for k, kind in enumerate(kinds) if kind == "d"]


def apply_changes(
    root_fd: int,
    target: Manifest,
    base: Manifest,
    changes: Changes,
    *,
    blobs: BlobStore,
    label: str,
    watch: Watch,
    owner: tuple[int, int] | None = None,
    progress: ProgressReporter | None = None,
) -> set[str]:
    """:func:`apply`, opening only the directories that differ or a journal names.

    ``base`` is the manifest the tree equalled when its journal last
    committed. A directory is left unopened when the journal saw nothing
    in it and ``base`` records exactly the entries ``target`` wants there;
    every other directory is brought in line as :func:`apply` does.

    Returns:
        The names of the entries written, created, removed or re-moded
        (every other entry is as it was), so the caller can re-check just
        what such names could be.

    Raises:
        Stale: As :func:`scan_changes` (entries before the failure may
            already be restored; a whole-tree :func:`apply` finishes them).
        OperationError: As :func:`apply`.
    """
    ap = _Applier(target, base, blobs, label, owner, progress=progress)
    ap.written = set()
    ap.links = watch.links
    follow = _Follow(root_fd)
    # (path components, target index, base index or -1, whole subtree, leaving)
    stack: list[tuple[tuple[str, ...], int, int, bool, bool]] = [((), 0, 0, False, False)]
    try:
        while stack:
            parts, t_dir, b_dir, whole, leaving = stack.pop()
            if leaving:
                fd = follow.go(parts)
                if stat.S_IMODE(os.fstat(fd).st_mode) != target.mode[t_dir]:
                    os.fchmod(fd, target.mode[t_dir])
                    ap.changed += 1
                continue
            rel = "/".join(parts)
            whole = whole or b_dir < 0 or rel in changes.subtrees
            same = None if whole or rel in changes.dirs else _same_dir(base, b_dir, target, t_dir)
            if same is None or base.mode[b_dir] != target.mode[t_dir]:
                fd = follow.go(parts)
                watch(fd, rel)
                if stat.S_IMODE(os.fstat(fd).st_mode) & 0o700 != 0o700:
                    os.fchmod(fd, 0o700)
                stack.append((parts, t_dir, b_dir, whole, True))
                subdirs = _apply_dir(ap, fd, t_dir, b_dir)
                if watch.links:
                    raise Stale
            else:
                if progress is not None:
                    progress.advance(_count(target, t_dir))
                subdirs = same
            stack.extend(
                ((*parts, name), t_idx, b_idx, whole, False)
                for name, t_idx, b_idx in reversed(subdirs)
            )
    finally:
        follow.close()
    return ap.written


def _count(m: Manifest, idx: int) -> int:
    span = m.span(idx)
    return 0 if span is None else span[1] - span[0]
