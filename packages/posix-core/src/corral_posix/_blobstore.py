"""Content-addressed blobs: the bytes of every file version, stored once by SHA-256.

A blob is named by the hex SHA-256 of its content and never changes once
written: a version's manifest refers to it by that name, and any number of
versions, workspaces and branches share it. Every read verifies the content
against the name, so a blob damaged on disk (or planted by someone who can
write the store) is reported, never handed out.

:class:`BlobStore` is the seam: :class:`LocalBlobStore` keeps blobs as plain
files on the workspace's own filesystem (so a branch can reflink them). An
object store (S3, GCS) would implement the same five operations -- ``has``,
``put``, ``open_verified`` (stream in, verify while reading), ``delete`` and
``names`` -- with the write made atomic by the store's own
put-if-absent; nothing above this module knows where blobs live.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import itertools
import operator
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Final, Protocol

__all__ = [
    "BLOB_NAME",
    "BlobError",
    "BlobStore",
    "LocalBlobStore",
    "all_blob_names",
    "clone_or_copy",
    "syncfs",
]

BLOB_NAME: Final = re.compile(r"[0-9a-f]{64}")
"""What a blob name (a content hash) looks like."""
_CHUNK: Final = 1 << 20
_FICLONE: Final = 0x40049409
_READ: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class BlobError(Exception):
    """A blob is missing or its content does not match its name.

    Attributes:
        digest: The blob's name.
        reason: ``"missing"`` or ``"corrupt"``.
        entry: For :meth:`LocalBlobStore.write_files`, the index of the
            entry it stopped at (-1 otherwise).
    """

    def __init__(self, digest: str, reason: str, entry: int = -1) -> None:
        super().__init__(f"blob {digest[:12]} is {reason}")
        self.digest = digest
        self.reason = reason
        self.entry = entry


class BlobStore(Protocol):
    """Where blobs live. All methods block; callers run them in a worker thread."""

    def has(self, digest: str) -> bool:
        """Whether a blob of that name is stored (its content is checked on read)."""
        ...

    def put(self, digest: str, data: bytes) -> int:
        """Store ``data`` under ``digest`` unless present; return the bytes newly stored."""
        ...

    def put_fd(self, src_fd: int) -> tuple[str, int, int]:
        """Store the rest of an open file; return ``(digest, size, bytes newly stored)``."""
        ...

    def copy_verified(self, digest: str, dst_fd: int, size_hint: int = 0) -> int:
        """Write the blob's content to ``dst_fd``, verifying it; return its size.

        ``size_hint`` (the size a manifest recorded) lets a small blob be
        read in one call; a wrong hint costs only speed.

        Raises:
            BlobError: The blob is missing or corrupt (``dst_fd`` then holds
                partial data the caller must discard).
        """
        ...

    def read_verified(self, digest: str, max_bytes: int) -> bytes:
        """The blob's content (at most ``max_bytes``; the caller checked the size).

        Raises:
            BlobError: The blob is missing, corrupt, or longer than ``max_bytes``.
        """
        ...

    def delete(self, digest: str) -> None:
        """Remove a blob; a missing one is fine."""
        ...

    def names(self) -> Iterator[str]:
        """Every stored blob name."""
        ...

    def sync(self) -> None:
        """Make every blob written so far durable (before a manifest refers to it)."""
        ...


def syncfs(fd: int) -> None:
    """Flush the whole filesystem holding ``fd``: one call instead of an fsync per blob."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        os.sync()
        return
    if fn(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def clone_or_copy(src_fd: int, dst_fd: int) -> bool:
    """Make ``dst_fd``'s content a reflink of ``src_fd`` where the filesystem can.

    ``FICLONE`` shares the data extents (btrfs, XFS): no bytes copied. The
    constant is passed by value because :mod:`fcntl` lacks it on older
    Pythons. Returns False (nothing done) where the filesystem cannot clone.
    """
    try:
        fcntl.ioctl(dst_fd, _FICLONE, src_fd)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.EBADF):
            return False
        raise
    return True


_Ident = tuple[int, int, int, int, int]
_VERIFIED_MAX: Final = 1 << 17
# digest -> identity of the blob file when its content last hashed right, for
# every store of the process (the identity names the file, so stores cannot
# mix). Blobs are never written in place (created 0400, renamed in), and any
# change to a file moves its ctime, which no process can set back: a blob
# whose identity is unchanged holds the bytes that were verified. Bounded
# (about 30 MB at most), emptied when full.
_VERIFIED: Final[dict[str, _Ident]] = {}


def all_blob_names(names: list[str]) -> bool:
    """Whether every string is a blob name (64 lowercase hex digits), in a few C-level passes.

    A manifest or a branch checks 100,000 names at once: a set of the
    joined characters costs about 0.6 us per name, this about 0.1 us.
    ``bytes.fromhex`` rejects anything but hex digits and whitespace; the
    length check rules out whitespace (each byte takes exactly two digits)
    and the ``lower`` check upper-case digits.
    """
    if any(len(n) != 64 for n in names):
        return False
    joined = "".join(names)
    try:
        decoded = bytes.fromhex(joined)
    except ValueError:
        return False
    return len(decoded) * 2 == len(joined) and joined.lower() == joined


def _write_all(fd: int, view: memoryview) -> None:
    """Write all of ``view`` (a regular file may take less than asked)."""
    while view:
        view = view[os.write(fd, view) :]


def _settle_window_ns() -> int:
    """How long after a file's last change its timestamps are sure to move on the next one.

    The kernel stamps files from its coarse clock, which lags the precise
    clock by less than one tick: once the precise clock is two ticks past a
    stamp, any later change gets a later stamp. Four ticks (at least 10 ms)
    leave room; where the tick cannot be read (not Linux), 200 ms.
    """
    if not sys.platform.startswith("linux"):
        return 200_000_000
    try:
        tick = time.clock_getres(getattr(time, "CLOCK_REALTIME_COARSE", 5))  # 5: Linux's number
    except OSError:
        return 200_000_000
    return max(4 * round(tick * 1e9), 10_000_000)


_SETTLED_NS: Final = _settle_window_ns()
# A stamp with no fraction of a second may come from a filesystem that keeps
# whole seconds (or two): its files are trusted only once that is surely past.
_WHOLE_SECONDS_SETTLED_NS: Final = 3_000_000_000


class _ContentMemory:
    """Small verified blobs' bytes, so a branch writes them from memory.

    digest -> (identity, content): used only while the blob file's identity
    (one stat) is still the one it had when its content hashed right, so
    damage to the file is noticed exactly as for :data:`_VERIFIED`, and a
    file is written with a stat, an open, a write and a close instead of
    also an open, an fstat, a copy and a close of the blob. Bounded by ``budget``
    bytes, each entry counted with its objects' overhead: when full, the
    oldest quarter is forgotten.
    """

    small: Final = 64 << 10
    # What an entry costs beyond its content: the digest string (113 bytes),
    # the identity tuple and its ints (236), the pair (56), the bytes header
    # (33) and the dict slot -- measured with sys.getsizeof, rounded up.
    overhead: Final = 512

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.items: dict[str, tuple[_Ident, bytes]] = {}
        self._used = 0
        self._lock = threading.Lock()

    def keep(self, digest: str, ident: _Ident, content: bytes) -> None:
        """Remember ``content`` (verified, of a blob whose file has ``ident``) if it is small."""
        cost = len(content) + self.overhead
        if len(content) != ident[2] or len(content) > self.small or cost > self.budget:
            return
        with self._lock:
            items = self.items
            old = items.pop(digest, None)
            if old is not None:
                self._used -= len(old[1]) + self.overhead
            while items and self._used + cost > self.budget:
                # The oldest quarter goes (a dict keeps insertion order): a tree
                # larger than the budget keeps most of what fits, not a remainder.
                for gone in list(itertools.islice(items, len(items) // 4 + 1)):
                    self._used -= len(items.pop(gone)[1]) + self.overhead
            self._used += cost
            items[digest] = (ident, content)

    def drop(self, digest: str) -> None:
        """Forget a blob."""
        with self._lock:
            gone = self.items.pop(digest, None)
            if gone is not None:
                self._used -= len(gone[1]) + self.overhead


_CONTENT: Final = _ContentMemory(64 << 20)


_ident: Final[Callable[[os.stat_result], _Ident]] = operator.attrgetter(
    "st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns"
)


class LocalBlobStore:
    """Blobs as read-only files ``<root>/<2 hex>/<62 hex>`` on a local filesystem.

    A blob is written to ``<root>/tmp/`` and renamed into place, so a crash
    leaves at worst an orphan temp file (removed by :meth:`sweep_tmp`), never
    a partial blob under a real name. ``put`` does not fsync each blob;
    :meth:`sync` flushes the filesystem once before a manifest commits.

    Args:
        root: The store directory (created ``0700`` if missing).
    """

    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(os.path.join(root, "tmp"), mode=0o700, exist_ok=True)
        self._root_fd: int | None = None
        self._retired: list[int] = []
        self._lock = threading.Lock()
        # Whether FICLONE may work here: one refusal settles it for the store,
        # so a filesystem without reflinks does not pay a failing ioctl per file.
        self._can_clone = True

    def close(self) -> None:
        """Release the store's directory fd (reopened on demand)."""
        with self._lock:
            fds, self._retired = self._retired, []
            if self._root_fd is not None:
                fds.append(self._root_fd)
                self._root_fd = None
        for fd in fds:
            os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _path(self, digest: str) -> str:
        if not BLOB_NAME.fullmatch(digest):
            raise BlobError(digest if digest.isalnum() else "?", "missing")
        return os.path.join(self.root, digest[:2], digest[2:])

    def has(self, digest: str) -> bool:
        """Whether a blob of that name is stored."""
        try:
            return os.path.isfile(self._path(digest))
        except BlobError:
            return False

    def _commit(self, tmp: str, digest: str) -> None:
        final = self._path(digest)
        try:
            os.rename(tmp, final)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
            os.rename(tmp, final)

    def _tmp(self) -> tuple[str, int]:
        tmp = os.path.join(self.root, "tmp", secrets.token_hex(12))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o400)
        return tmp, fd

    def _holds(self, digest: str, data: bytes | None) -> bool:
        """Whether a sound blob of that name is stored (``data``: its expected content).

        Deduplication is a read too: a new version must never point at a
        blob that was damaged after an older version stored it. A damaged
        one is replaced by the caller (rename over it), which also heals it
        for the older versions.
        """
        try:
            fd = self._open(digest)
        except BlobError:
            return False
        try:
            if data is not None:
                # A regular file's read returns all it has; one byte more shows a longer blob.
                return os.read(fd, len(data) + 1) == data
            hasher = hashlib.sha256()
            while chunk := os.read(fd, _CHUNK):
                hasher.update(chunk)
            return hasher.hexdigest() == digest
        finally:
            os.close(fd)

    def put(self, digest: str, data: bytes) -> int:
        """Store ``data`` under ``digest`` unless a sound copy is there; return the bytes stored."""
        if self._holds(digest, data):
            return 0
        tmp, fd = self._tmp()
        try:
            _write_all(fd, memoryview(data))
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        self._commit(tmp, digest)
        return len(data)

    def put_fd(self, src_fd: int) -> tuple[str, int, int]:
        """Stream the rest of ``src_fd`` into the store, hashing as it goes."""
        tmp, fd = self._tmp()
        hasher = hashlib.sha256()
        size = 0
        try:
            while chunk := os.read(src_fd, _CHUNK):
                hasher.update(chunk)
                size += len(chunk)
                _write_all(fd, memoryview(chunk))
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        digest = hasher.hexdigest()
        if self._holds(digest, None):
            os.unlink(tmp)
            return digest, size, 0
        self._commit(tmp, digest)
        return digest, size, size

    def _root(self) -> int:
        """The store directory's fd, opened on first use."""
        root_fd = self._root_fd
        if root_fd is None:
            with self._lock:  # callers may share a store across threads
                if self._root_fd is None:
                    self._root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                root_fd = self._root_fd
        return root_fd

    def _open(self, digest: str) -> int:
        if not BLOB_NAME.fullmatch(digest):
            raise BlobError(digest if digest.isalnum() else "?", "missing")
        rel = f"{digest[:2]}/{digest[2:]}"
        for attempt in range(2):
            root_fd = self._root()
            try:
                # Relative to the store's fd: two lookups, not the whole path's.
                return os.open(rel, _READ, dir_fd=root_fd)
            except FileNotFoundError:
                if attempt or os.fstat(root_fd).st_nlink:
                    raise BlobError(digest, "missing") from None
                # The store directory was replaced: look it up again. The old fd
                # stays open until close(): another thread may be using it, and a
                # closed number could be reused under it.
                with self._lock:
                    if self._root_fd == root_fd:
                        self._retired.append(root_fd)
                        self._root_fd = None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise BlobError(digest, "corrupt") from None
                raise
        raise BlobError(digest, "missing")

    def _trust(self, digest: str, ident: _Ident, content: bytes | None = None) -> None:
        # Timestamps tick coarsely: a change within a tick of the last one can
        # leave them as they were, so only a blob untouched for a while is
        # recognised by them later (git's "racily clean" rule).
        last = max(ident[3], ident[4])
        coarse = ident[3] % 1_000_000_000 == 0 and ident[4] % 1_000_000_000 == 0
        if time.time_ns() - last < (_WHOLE_SECONDS_SETTLED_NS if coarse else _SETTLED_NS):
            return
        if len(_VERIFIED) >= _VERIFIED_MAX:
            _VERIFIED.clear()
        _VERIFIED[digest] = ident
        if content is not None:
            _CONTENT.keep(digest, ident, content)

    @staticmethod
    def _distrust(digest: str) -> None:
        _VERIFIED.pop(digest, None)
        _CONTENT.drop(digest)

    def copy_verified(self, digest: str, dst_fd: int, size_hint: int = 0) -> int:
        """Copy (or reflink) the blob into ``dst_fd``, verifying every byte.

        A blob this store verified before and whose file is unchanged since
        (same device, inode, size, mtime and ctime, before and after the
        copy) is copied by the kernel without hashing it again.
        """
        src = self._open(digest)
        try:
            before = _ident(os.fstat(src))
            if _VERIFIED.get(digest) == before:
                size = self._copy_plain(src, dst_fd, before[2])
                if _ident(os.fstat(src)) == before:
                    return size
                # Changed while copied: start over, hashing this time.
                self._distrust(digest)
                os.lseek(src, 0, os.SEEK_SET)
                os.lseek(dst_fd, 0, os.SEEK_SET)
                os.ftruncate(dst_fd, 0)
            hasher = hashlib.sha256()
            size = 0
            cloned = False
            if self._can_clone:
                cloned = clone_or_copy(src, dst_fd)
                self._can_clone = cloned
            want = min(size_hint, _CHUNK) + 1
            first = b""
            while chunk := os.read(src, want):
                hasher.update(chunk)
                if not size:
                    first = chunk
                size += len(chunk)
                if not cloned:
                    _write_all(dst_fd, memoryview(chunk))
                if len(chunk) < want:
                    break  # a short read of a regular file is its end
                want = _CHUNK
            after = _ident(os.fstat(src))
        finally:
            os.close(src)
        if hasher.hexdigest() != digest:
            self._distrust(digest)
            raise BlobError(digest, "corrupt")
        if after == before:
            self._trust(digest, before, first if len(first) == size else None)
        return size

    def write_files(
        self,
        dir_fd: int,
        entries: list[tuple[str, str, int, int]],
        *,
        umask: int | None,
        owner: tuple[int, int] | None,
    ) -> None:
        """Create new files in ``dir_fd`` from blobs: ``(name, digest, size, mode)`` each.

        What a branch does per file, in one loop: at 100,000 small files the
        calls between the steps cost as much as the system calls, and
        ``cp -a`` is the yardstick. Each file is created ``O_EXCL`` (never
        following a link), filled as :meth:`copy_verified` would (a blob
        remembered as verified and unchanged is copied by the kernel, any
        other is hashed while copied), given to ``owner``, and chmod'ed only
        where ``umask`` took bits its mode holds (``umask`` None: always).

        Raises:
            BlobError: A blob is missing or corrupt; ``entry`` says which
                (its file holds partial data; the caller discards the tree).
        """
        if not all_blob_names([e[1] for e in entries]):
            raise BlobError("?", "missing", 0)  # never a path: names are hex digests
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        open_, close, stat_, write, kept_ = os.open, os.close, os.stat, os.write, _CONTENT.items
        root_fd = self._root()
        for k, (name, digest, size, mode) in enumerate(entries):
            rel = f"{digest[:2]}/{digest[2:]}"
            kept = kept_.get(digest)
            if kept is not None:
                try:
                    if _ident(stat_(rel, dir_fd=root_fd, follow_symlinks=False)) != kept[0]:
                        kept = None  # the file changed since its bytes were remembered
                except OSError:
                    kept = None
            fd = open_(name, flags, mode, dir_fd=dir_fd)
            try:
                if kept is None:
                    self._fill(fd, root_fd, digest, size, rel=rel, entry=k)
                elif (done := write(fd, kept[1])) != len(kept[1]):
                    _write_all(fd, memoryview(kept[1])[done:])
                if owner is not None:
                    os.fchown(fd, *owner)
                if umask is None or mode & umask:
                    os.fchmod(fd, mode)  # the umask took bits the version holds
            finally:
                close(fd)

    def _fill(self, fd: int, root_fd: int, digest: str, size: int, *, rel: str, entry: int) -> None:
        """Fill a new file from a blob (at ``rel`` in the store) the kernel copies when verified."""
        try:
            src = os.open(rel, _READ, dir_fd=root_fd)
        except OSError:
            try:
                src = self._open(digest)  # the slow path names what went wrong
            except BlobError as exc:
                raise BlobError(digest, exc.reason, entry) from None
        try:
            # Copy first, look after: a blob file whose identity is still the one
            # it had when its content hashed right has not been written since
            # (a change after the settle window moves its ctime), so what was
            # copied is that content. One fstat per file instead of two.
            known = _VERIFIED.get(digest)
            trusted = False
            if known is not None:
                if self._can_clone or os.copy_file_range(src, fd, known[2]) != known[2]:
                    os.lseek(src, 0, os.SEEK_SET)
                    os.lseek(fd, 0, os.SEEK_SET)
                    self._copy_plain(src, fd, known[2])
                trusted = _ident(os.fstat(src)) == known
        finally:
            os.close(src)
        if not trusted:
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            try:
                self.copy_verified(digest, fd, size)
            except BlobError as exc:
                raise BlobError(digest, exc.reason, entry) from None

    def _copy_plain(self, src: int, dst_fd: int, size: int) -> int:
        """Copy ``size`` bytes in the kernel (or reflink them); return the bytes copied."""
        if self._can_clone:
            self._can_clone = clone_or_copy(src, dst_fd)
            if self._can_clone:
                return size
        done = 0
        try:
            while done < size and (n := os.copy_file_range(src, dst_fd, size - done)):
                done += n
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            while chunk := os.read(src, _CHUNK):
                _write_all(dst_fd, memoryview(chunk))
                done += len(chunk)
        return done

    def read_verified(self, digest: str, max_bytes: int) -> bytes:
        """The blob's verified content (not hashed again while its file is unchanged)."""
        fd = self._open(digest)
        try:
            before = _ident(os.fstat(fd))
            data = os.read(fd, max_bytes + 1)
            chunks = [data]
            while data and sum(map(len, chunks)) <= max_bytes:
                data = os.read(fd, _CHUNK)
                chunks.append(data)
            after = _ident(os.fstat(fd))
        finally:
            os.close(fd)
        whole = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if len(whole) > max_bytes:
            raise BlobError(digest, "corrupt")
        if after == before and _VERIFIED.get(digest) == before:
            return whole
        if hashlib.sha256(whole).hexdigest() != digest:
            self._distrust(digest)
            raise BlobError(digest, "corrupt")
        if after == before:
            self._trust(digest, before, whole)
        return whole

    def delete(self, digest: str) -> None:
        """Remove a blob; a missing one is fine."""
        with contextlib.suppress(FileNotFoundError, BlobError):
            os.unlink(self._path(digest))

    def names(self) -> Iterator[str]:
        """Every stored blob name."""
        try:
            prefixes = os.listdir(self.root)
        except FileNotFoundError:
            return
        for prefix in prefixes:
            if len(prefix) != 2:
                continue
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for rest in os.listdir(os.path.join(self.root, prefix)):
                    if BLOB_NAME.fullmatch(prefix + rest):
                        yield prefix + rest

    def sweep_tmp(self) -> None:
        """Remove temp files of writes that crashed (call with the store locked exclusively)."""
        tmpdir = os.path.join(self.root, "tmp")
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(tmpdir):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(tmpdir, name))

    def sync(self) -> None:
        """Flush the store's filesystem."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            syncfs(fd)
        finally:
            os.close(fd)
