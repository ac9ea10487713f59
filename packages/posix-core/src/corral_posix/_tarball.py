"""Writing a directory tree to a tarball and extracting one back, both without trusting the tree.

Writing walks with directory fds and ``O_NOFOLLOW``: a symlink is stored as
a symlink and never followed, so a link to ``/etc`` or to a directory outside
the workspace cannot pull outside data into a snapshot, and a directory
swapped for a symlink mid-walk is refused by the kernel rather than read
through. FIFOs, sockets and device nodes are skipped (and logged).

Extraction treats the tarball as hostile even though we wrote it (it sits in
a directory the workspace's user can write): regular files and directories
go through :func:`tarfile.data_filter` (no absolute names, no ``..``, no
device files, no setuid bits); symlinks are created afterwards, by us, each
in a parent opened with ``O_NOFOLLOW`` from the destination fd, so no member
can ever be written through a link. Their targets are kept verbatim (a link
to ``/usr/bin/python3`` is legitimate workspace content and harmless here,
since nothing follows it during extraction and the filesystem module never
follows a link out of the workspace). Directory modes are applied last, so
a read-only directory still receives its entries.
"""

from __future__ import annotations

import logging
import os
import stat
import tarfile
from typing import IO, Final

from corral.provider import OperationError

from ._fdtree import DirChain

__all__ = ["MAX_SNAPSHOT_DEPTH", "MAX_SNAPSHOT_PATH", "extract_tree", "write_tree"]

log = logging.getLogger("corral.posix.snapshots")

MAX_SNAPSHOT_DEPTH: Final = 256
MAX_SNAPSHOT_PATH: Final = 3072
"""Longest relative path a snapshot stores: restore recreates paths under a
staging directory by name, and the whole must stay under ``PATH_MAX``."""
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class _ExactReader:
    """Reads exactly ``size`` bytes from an fd, zero-padding if the file shrank meanwhile."""

    def __init__(self, fd: int, size: int, arcname: str) -> None:
        self._fd = fd
        self._left = size
        self._arcname = arcname
        self._warned = False

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        n = self._left if n < 0 else min(n, self._left)
        chunks: list[bytes] = []
        got = 0
        while got < n:
            data = os.read(self._fd, n - got)
            if not data:
                if not self._warned:
                    log.warning("snapshot: %s shrank while being read; padded", self._arcname)
                    self._warned = True
                chunks.append(b"\0" * (n - got))
                break
            chunks.append(data)
            got += len(data)
        self._left -= n
        return b"".join(chunks)


def _info(arcname: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(arcname)
    info.type = kind
    info.mode = stat.S_IMODE(st.st_mode) & 0o777
    info.mtime = int(st.st_mtime)
    # No owner names or ids: they leak host details and restore ignores them.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _too_deep() -> OperationError:
    return OperationError(
        f"the workspace is nested deeper than {MAX_SNAPSHOT_DEPTH} directories; "
        "it cannot be snapshotted",
        code="too_large",
    )


def _add_entry(
    tar: tarfile.TarFile, chain: DirChain, name: str, arcname: str, skipped: list[str]
) -> bool:
    """Add one entry of the current directory; return whether it is a directory to enter."""
    dir_fd = chain.fd
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False  # removed while we walked
    if len(arcname.encode("utf-8", "surrogateescape")) > MAX_SNAPSHOT_PATH:
        raise OperationError(
            f"the workspace holds a path longer than {MAX_SNAPSHOT_PATH} bytes; "
            "it cannot be snapshotted",
            code="too_large",
        )
    if stat.S_ISLNK(st.st_mode):
        info = _info(arcname, st, tarfile.SYMTYPE)
        info.linkname = os.readlink(name, dir_fd=dir_fd)
        tar.addfile(info)
        return False
    if stat.S_ISDIR(st.st_mode):
        return True
    if not stat.S_ISREG(st.st_mode):
        skipped.append(arcname)
        return False
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        skipped.append(arcname)
        return False
    try:
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode):
            skipped.append(arcname)
            return False
        info = _info(arcname, fst, tarfile.REGTYPE)
        info.size = fst.st_size
        tar.addfile(info, _ExactReader(fd, fst.st_size, arcname))
    finally:
        os.close(fd)
    return False


def _add_tree(tar: tarfile.TarFile, root_fd: int, skipped: list[str]) -> None:
    """Add everything under ``root_fd``, parents before children, names sorted.

    Iterative with one directory fd below the root at any depth (see
    :class:`DirChain`); the depth cap is a limit on what restore can
    recreate, not on this walk.
    """
    chain = DirChain(root_fd)
    with os.scandir(root_fd) as it:
        levels: list[tuple[str, list[str]]] = [("", sorted((e.name for e in it), reverse=True))]
    try:
        while levels:
            prefix, names = levels[-1]
            if not names:
                levels.pop()
                if levels:
                    chain.ascend()
                continue
            name = names.pop()
            arcname = f"{prefix}/{name}" if prefix else name
            if not _add_entry(tar, chain, name, arcname, skipped):
                continue
            if len(levels) > MAX_SNAPSHOT_DEPTH:
                raise _too_deep()
            try:
                outcome = chain.descend(name)
            except OSError:
                outcome = "gone"
            if outcome != "entered":
                skipped.append(arcname)  # replaced by a symlink or removed mid-walk
                continue
            tar.addfile(_info(arcname, os.fstat(chain.fd), tarfile.DIRTYPE))
            with os.scandir(chain.fd) as it:
                levels.append((arcname, sorted((e.name for e in it), reverse=True)))
    finally:
        chain.close()


def write_tree(root: str, out: IO[bytes], *, compresslevel: int = 1) -> list[str]:
    """Write the tree under ``root`` as a gzip tarball to ``out``; return skipped paths.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        OperationError: The tree is too deep or holds too long a path.
    """
    skipped: list[str] = []
    root_fd = os.open(root, _DIR_FLAGS)
    try:
        with tarfile.open(
            fileobj=out, mode="w:gz", compresslevel=compresslevel, format=tarfile.PAX_FORMAT
        ) as tar:
            _add_tree(tar, root_fd, skipped)
    finally:
        os.close(root_fd)
    if skipped:
        log.warning(
            "snapshot: skipped %d special or vanished entries (FIFOs, sockets, devices): %s",
            len(skipped),
            ", ".join(skipped[:20]),
        )
    return skipped


def _clean_parts(name: str) -> list[str]:
    if name.startswith("/") or "\0" in name:
        raise tarfile.FilterError("absolute or NUL member name")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise tarfile.FilterError("member name escapes the destination")
    return parts


def _open_beneath(root_fd: int, parts: list[str]) -> int:
    fd = os.dup(root_fd)
    for part in parts:
        try:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nxt
    return fd


def _filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    safe = tarfile.data_filter(member, dest)
    # data_filter drops directory modes and group/other bits; keep the
    # permission bits (never setuid/setgid/sticky) for an exact restore, and
    # keep directories writable until every entry is in (modes come last).
    mode = 0o700 if member.isdir() else member.mode & 0o777
    return safe.replace(mode=mode, deep=False)


def extract_tree(tar_path: str, dest: str) -> None:
    """Extract a snapshot tarball into the empty directory ``dest``.

    Raises:
        OperationError: The tarball is damaged or holds something unsafe
            (hard links, devices, names escaping ``dest``, links in paths).
    """
    try:
        with tarfile.open(tar_path, mode="r:gz") as tar:
            members = tar.getmembers()
            plain: list[tarfile.TarInfo] = []
            links: list[tarfile.TarInfo] = []
            dir_modes: list[tuple[list[str], int]] = []
            for member in members:
                parts = _clean_parts(member.name)
                if member.issym():
                    links.append(member)
                elif member.isdir():
                    plain.append(member)
                    dir_modes.append((parts, member.mode & 0o777))
                elif member.isreg():
                    plain.append(member)
                else:
                    raise tarfile.FilterError("unsupported member type")
            # Members were vetted above and _filter applies data_filter to each.
            tar.extractall(dest, members=plain, filter=_filter)  # noqa: S202
        dest_fd = os.open(dest, _DIR_FLAGS)
        try:
            for member in links:
                parts = _clean_parts(member.name)
                parent = _open_beneath(dest_fd, parts[:-1])
                try:
                    os.symlink(member.linkname, parts[-1], dir_fd=parent)
                finally:
                    os.close(parent)
            # Deepest first, so a read-only parent does not block its children.
            for parts, mode in sorted(dir_modes, key=lambda d: -len(d[0])):
                fd = _open_beneath(dest_fd, parts)
                try:
                    os.fchmod(fd, mode)
                finally:
                    os.close(fd)
        finally:
            os.close(dest_fd)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise OperationError("the snapshot is damaged or unsafe to restore", code="failed") from exc
