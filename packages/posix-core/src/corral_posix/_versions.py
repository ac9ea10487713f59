"""Walking a live tree into a manifest, and bringing a tree to a manifest by difference.

Both walks are iterative and fd-based (:class:`~corral_posix._fdtree.DirChain`):
one directory fd below the top at any depth, every entry acted on by name
relative to its directory fd, symlinks never followed (``O_NOFOLLOW``), so
a command that swaps a directory for a symlink mid-walk redirects nothing.

:func:`scan` reads only what changed: an entry whose
``(dev, ino, size, mtime_ns, ctime_ns)`` equals the previous manifest's
record at the same path keeps its hash. Files touched too close to the
previous scan (timestamps have a clock tick of granularity) are not trusted
and are hashed again, as git does with "racily clean" entries.

:func:`apply` makes the tree under a directory fd equal a manifest,
touching only what differs: extra entries are removed, missing and changed
files are written to an ``O_EXCL`` temp file in their directory (content
verified against its hash while copied) and renamed over, modes fixed,
symlinks recreated as data. Directory modes are set when the walk leaves
the directory, so a read-only directory still receives its entries.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import secrets
import stat
from typing import Final

import attrs

from corral.provider import OperationError, ProgressReporter

from ._blobstore import BlobError, BlobStore
from ._fdtree import DirChain, _make_accessible, remove_tree_at
from ._manifest import Builder, Manifest, kind_of, st_key

__all__ = ["Caps", "apply", "scan"]

log = logging.getLogger("corral.posix.versions")

_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_SMALL: Final = 1 << 20
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


def _too_large(what: str) -> OperationError:
    return OperationError(
        f"the workspace holds more than {what}; it cannot be snapshotted", code="too_large"
    )


def _list(fd: int) -> list[tuple[str, os.stat_result]]:
    out = []
    with os.scandir(fd) as it:
        for entry in it:
            try:
                out.append((entry.name, entry.stat(follow_symlinks=False)))
            except FileNotFoundError:
                continue
    out.sort(key=lambda e: e[0], reverse=True)
    return out


def _hash_file(
    dir_fd: int, name: str, blobs: BlobStore | None, caps: Caps
) -> tuple[str, int, str] | None:
    """Read and hash one file (storing it); ``(digest, size, key)`` or None if not a file now."""
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
    same = (before.st_mtime_ns, before.st_ctime_ns, before.st_size) == (
        after.st_mtime_ns,
        after.st_ctime_ns,
        after.st_size,
    )
    return digest, size, st_key(before) if same and size == before.st_size else ""


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


def scan(  # noqa: PLR0915 -- one walk, its branches side by side
    root_fd: int,
    prev: Manifest | None,
    blobs: BlobStore | None,
    caps: Caps,
    trust_before_ns: int,
    *,
    progress: ProgressReporter | None = None,
) -> tuple[Manifest, list[str]]:
    """The manifest of the tree under ``root_fd``; changed files stored in ``blobs``.

    Args:
        root_fd: The workspace root (borrowed).
        prev: The previous manifest of this workspace, for change detection.
        blobs: Where new content goes; None only hashes (``diff`` against now).
        caps: Entry and byte caps.
        trust_before_ns: Only keys whose mtime and ctime are older than this
            (the previous scan's start minus :data:`RACY_NS`) are trusted.
        progress: Advanced once per entry walked (kept or skipped); its
            total stays as given (None: a tree's size is unknown until walked).
            The caller finishes it.

    Returns:
        The manifest and the paths skipped (special files, entries that
        vanished or turned into something else mid-walk).

    Raises:
        OperationError: ``too_large`` over a cap.
    """
    b = Builder(stat.S_IMODE(os.fstat(root_fd).st_mode))
    skipped: list[str] = []
    total = 0
    chain = DirChain(root_fd)
    # levels: (index in the new manifest, index in prev or -1, path, pending entries)
    levels: list[tuple[int, int, str, list[tuple[str, os.stat_result]]]] = [
        (0, 0 if prev is not None else -1, "", _list(root_fd))
    ]
    try:
        while levels:
            me, old_dir, base, pending = levels[-1]
            if not pending:
                levels.pop()
                if levels:
                    chain.ascend()
                continue
            name, st = pending.pop()
            if progress is not None:
                progress.advance()
            path = f"{base}/{name}"
            kind = kind_of(st.st_mode)
            if kind is None:
                skipped.append(path)
                continue
            if len(b.m.parent) >= caps.max_entries:
                raise _too_large(f"{caps.max_entries} entries")
            old = prev.children(old_dir).get(name, -1) if prev is not None and old_dir >= 0 else -1
            mode = stat.S_IMODE(st.st_mode)
            if kind == "l":
                try:
                    target = os.readlink(name, dir_fd=chain.fd)
                except OSError:
                    skipped.append(path)
                    continue
                b.add(me, name, "l", 0o777, len(os.fsencode(target)), target, "")
                continue
            if kind == "d":
                try:
                    outcome = chain.descend(name)
                except PermissionError:
                    _make_accessible(chain.fd, name)
                    outcome = chain.descend(name)
                if outcome != "entered":
                    skipped.append(path)
                    continue
                idx = b.add(me, name, "d", mode, 0, "", "")
                sub = old if old >= 0 and prev is not None and prev.kind[old] == "d" else -1
                levels.append((idx, sub, path, _list(chain.fd)))
                continue
            key = st_key(st)
            if (
                prev is not None
                and old >= 0
                and prev.kind[old] == "f"
                and prev.key[old] == key
                and st.st_mtime_ns < trust_before_ns
                and st.st_ctime_ns < trust_before_ns
            ):
                digest, size = prev.data[old], prev.size[old]
            else:
                got = _hash_file(chain.fd, name, blobs, caps)
                if got is None:
                    skipped.append(path)
                    continue
                digest, size, key = got
            total += size
            if total > caps.max_bytes:
                raise _too_large(f"{caps.max_bytes} bytes")
            b.add(me, name, "f", mode, size, digest, key)
    finally:
        chain.close()
    if skipped:
        log.warning(
            "snapshot: skipped %d special or vanished entries: %s",
            len(skipped),
            ", ".join(skipped[:20]),
        )
    return b.m, skipped


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
    ) -> None:
        self.t = target
        self.progress = progress
        self.index = index
        self.blobs = blobs
        self.label = label
        self.owner = owner
        self.changed = 0

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
                self.blobs.copy_verified(self.t.data[idx], fd)
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
        self.changed += 1

    def file_matches(self, dir_fd: int, name: str, st: os.stat_result, idx: int, old: int) -> bool:
        index = self.index
        if (
            index is not None
            and old >= 0
            and index.kind[old] == "f"
            and index.key[old]
            and index.key[old] == st_key(st)
        ):
            return index.data[old] == self.t.data[idx]
        if st.st_size != self.t.size[idx]:
            return False
        got = _hash_file(dir_fd, name, None, Caps())
        return got is not None and got[0] == self.t.data[idx]


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

    Raises:
        OperationError: A stored blob is missing or corrupt (nothing was
            written from it), or the tree cannot be changed.
    """
    ap = _Applier(target, index, blobs, label, owner, progress=progress)
    chain = DirChain(root_fd)
    if stat.S_IMODE(os.fstat(root_fd).st_mode) & 0o700 != 0o700:
        os.fchmod(root_fd, 0o700)
    # levels: (target dir index, index dir index or -1, subdirectories still to enter)
    levels: list[tuple[int, int, list[tuple[str, int, int]]]] = [
        (
            0,
            0 if index is not None else -1,
            _apply_dir(ap, chain.fd, 0, 0 if index is not None else -1),
        )
    ]
    try:
        while levels:
            t_dir, _i_dir, pending = levels[-1]
            if pending:
                name, t_idx, i_idx = pending.pop()
                try:
                    outcome = chain.descend(name)
                except PermissionError:
                    _make_accessible(chain.fd, name)
                    outcome = chain.descend(name)
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
    finally:
        chain.close()
    return ap.changed


def _apply_dir(ap: _Applier, dir_fd: int, t_dir: int, i_dir: int) -> list[tuple[str, int, int]]:
    """Fix the entries of one directory; return its subdirectories to enter."""
    t = ap.t
    want = t.children(t_dir)
    have = dict(_list(dir_fd))
    idx_kids = ap.index.children(i_dir) if ap.index is not None and i_dir >= 0 else {}
    for name in have.keys() - want.keys():
        remove_tree_at(dir_fd, name)
        ap.changed += 1
    subdirs: list[tuple[str, int, int]] = []
    for name in sorted(want, reverse=True):
        if ap.progress is not None:
            ap.progress.advance()
        idx = want[name]
        kind = t.kind[idx]
        st = have.get(name)
        old = idx_kids.get(name, -1)
        if st is not None and kind_of(st.st_mode) != kind:
            remove_tree_at(dir_fd, name)
            ap.changed += 1
            st = None
        if kind == "d":
            if st is None:
                os.mkdir(name, 0o700, dir_fd=dir_fd)
                ap.own(dir_fd, name)
                ap.changed += 1
            sub = old if old >= 0 and ap.index is not None and ap.index.kind[old] == "d" else -1
            subdirs.append((name, idx, sub))
        elif kind == "l":
            if st is not None:
                try:
                    same = os.readlink(name, dir_fd=dir_fd) == t.data[idx]
                except OSError:
                    same = False
                if same:
                    continue
                os.unlink(name, dir_fd=dir_fd)
            os.symlink(t.data[idx], name, dir_fd=dir_fd)
            ap.own(dir_fd, name)
            ap.changed += 1
        elif st is None or not ap.file_matches(dir_fd, name, st, idx, old):
            ap.write_file(dir_fd, name, idx)
        elif stat.S_IMODE(st.st_mode) != t.mode[idx]:
            try:
                _chmod_entry(dir_fd, name, t.mode[idx])
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise
                ap.write_file(dir_fd, name, idx)
            ap.changed += 1
    subdirs.reverse()
    return subdirs
