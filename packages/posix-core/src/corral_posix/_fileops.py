"""Blocking file operations beneath a root fd: read, atomic write, edit, stat, mkdir, rm.

Each function is one syscall sequence that :class:`TmpdirFileSystem` runs in a
worker thread. Every path goes through :func:`open_beneath`; every name acted
on is relative to a directory fd resolved beneath the root, so a concurrent
symlink or rename can change which file inside the workspace is hit but never
carry an operation outside it.

Writes never modify an existing inode: the new content goes to a temp file
created ``O_EXCL`` in the same directory, is fsynced and renamed over the old
entry. A file hard-linked from elsewhere (``st_nlink > 1``) is therefore safe
to "overwrite": only this directory entry changes, the other link keeps its
content.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Sequence
from typing import Final

import attrs

from corral.provider import (
    DEFAULT_MAX_FILE_BYTES,
    FileStat,
    FileType,
    OperationError,
    apply_edit,
    path_parts,
)

from ._fdtree import remove_tree_at
from ._resolve import Resolver, errno_code, open_beneath

__all__ = [
    "READ_FLAGS",
    "FsConfig",
    "edit_text",
    "file_type",
    "mkdir",
    "oserror",
    "read_bytes",
    "read_regular",
    "rm",
    "stat_path",
    "where",
    "write_atomic",
]

READ_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
DIR_FLAGS: Final = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


@attrs.frozen
class FsConfig:
    """Limits and policy shared by every operation of one file system."""

    resolver: Resolver = "auto"
    allow_leaf_symlinks: bool = False
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_walk_entries: int = 100_000
    max_walk_depth: int = 64


def where(parts: Sequence[str]) -> str:
    """The agent-view path of clean components."""
    return "/" + "/".join(parts)


def oserror(exc: OSError, parts: Sequence[str], action: str) -> OperationError:
    """Translate an OSError into an OperationError naming the agent's path."""
    err = exc.errno or errno.EIO
    return OperationError(
        f"cannot {action} {where(parts)}: {os.strerror(err).lower()}", code=errno_code(err)
    )


def file_type(mode: int) -> FileType:
    """Classify an ``st_mode`` into corral's four file types."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def read_regular(fd: int, parts: Sequence[str], max_bytes: int) -> bytes:
    """Read a whole regular file from an fd opened ``O_NONBLOCK``, within a cap.

    The fstat comes first: a FIFO, socket or device is refused before any
    read (a FIFO read would block), and the size cap before any byte is read.
    """
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            raise OperationError(f"{where(parts)} is a directory", code="is_a_directory")
        raise OperationError(
            f"{where(parts)} is not a regular file ({file_type(st.st_mode)})",
            code="unsupported_file_type",
        )
    if st.st_size > max_bytes:
        raise OperationError(
            f"{where(parts)} is {st.st_size} bytes, over the {max_bytes}-byte limit",
            code="too_large",
        )
    chunks = [os.read(fd, st.st_size + 1)]
    total = len(chunks[0])
    # The file may grow after the fstat; keep reading to EOF but never past the cap.
    while chunks[-1]:
        if total > max_bytes:
            raise OperationError(
                f"{where(parts)} grew past the {max_bytes}-byte limit while being read",
                code="too_large",
            )
        chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
        total += len(chunk)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 2 else b"".join(chunks)


def read_bytes(
    root_fd: int, parts: Sequence[str], cfg: FsConfig, max_bytes: int | None = None
) -> bytes:
    """``read_file``: open beneath the root, fstat, read within the cap."""
    fd = open_beneath(
        root_fd, parts, READ_FLAGS, resolver=cfg.resolver, follow_leaf=cfg.allow_leaf_symlinks
    )
    try:
        return read_regular(fd, parts, cfg.max_file_bytes if max_bytes is None else max_bytes)
    except OSError as exc:
        raise oserror(exc, parts, "read") from None
    finally:
        os.close(fd)


def _open_parent(root_fd: int, parts: Sequence[str], cfg: FsConfig, create: bool) -> int:
    """An O_PATH fd of the directory holding ``parts[-1]``, optionally creating it."""
    parent = parts[:-1]
    if create:
        return _open_dir_creating(root_fd, parent, cfg)
    return open_beneath(root_fd, parent, DIR_FLAGS, resolver=cfg.resolver, follow_leaf=True)


def _open_dir_creating(root_fd: int, parts: Sequence[str], cfg: FsConfig) -> int:
    try:
        return open_beneath(root_fd, parts, DIR_FLAGS, resolver=cfg.resolver, follow_leaf=True)
    except OperationError as exc:
        if exc.code != "not_found" or not parts:
            raise
    parent = _open_dir_creating(root_fd, parts[:-1], cfg)
    try:
        try:
            os.mkdir(parts[-1], 0o777, dir_fd=parent)
        except FileExistsError:
            pass  # created concurrently, or a dangling symlink: the open below decides
        except OSError as exc:
            raise oserror(exc, parts, "create directory") from None
        # The leaf is not followed: a dangling symlink we failed to create over
        # must not become a directory somewhere else.
        return open_beneath(parent, parts[-1:], DIR_FLAGS, resolver=cfg.resolver)
    finally:
        os.close(parent)


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _follow_lexically(parts: Sequence[str], dir_fd: int) -> tuple[str, ...]:
    """The path a leaf symlink points to, as root-relative parts (still resolved
    beneath the root by the caller, so a lexical answer cannot escape)."""
    target = os.readlink(parts[-1], dir_fd=dir_fd)
    if target.startswith("/"):
        raise OperationError(f"{where(parts)} is an absolute symlink", code="invalid_path")
    return path_parts("/".join((*parts[:-1], target)))


def write_atomic(root_fd: int, parts: Sequence[str], data: bytes, cfg: FsConfig) -> None:
    """``write_file``: create parents, write a temp file, fsync, rename over."""
    if len(data) > cfg.max_file_bytes:
        raise OperationError(
            f"{len(data)} bytes is over the {cfg.max_file_bytes}-byte file limit",
            code="too_large",
        )
    _replace(root_fd, parts, data, cfg, create_parents=True)


def _replace(
    root_fd: int, parts: Sequence[str], data: bytes, cfg: FsConfig, *, create_parents: bool
) -> None:
    if not parts:
        raise OperationError("/ is a directory", code="is_a_directory")
    for _ in range(40):
        parent = _open_parent(root_fd, parts, cfg, create_parents)
        try:
            old = _lstat(parts[-1], parent)
            if old is not None and stat.S_ISLNK(old.st_mode):
                if not cfg.allow_leaf_symlinks:
                    raise OperationError(
                        f"{where(parts)} is a symlink; writing through symlinks is not allowed",
                        code="invalid_path",
                    )
                parts = _follow_lexically(parts, parent)
                if not parts:
                    raise OperationError("/ is a directory", code="is_a_directory")
                continue
            if old is not None and not stat.S_ISREG(old.st_mode):
                if stat.S_ISDIR(old.st_mode):
                    raise OperationError(f"{where(parts)} is a directory", code="is_a_directory")
                raise OperationError(
                    f"{where(parts)} is not a regular file ({file_type(old.st_mode)})",
                    code="unsupported_file_type",
                )
            _write_into(parent, parts, data, None if old is None else old.st_mode)
        except OSError as exc:
            raise oserror(exc, parts, "write") from None
        else:
            return
        finally:
            os.close(parent)
    raise OperationError(f"{where(parts)}: too many levels of symlinks", code="invalid_path")


def _write_into(parent: int, parts: Sequence[str], data: bytes, old_mode: int | None) -> None:
    tmp = f".corral-{secrets.token_hex(8)}.tmp"
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o666,
        dir_fd=parent,
    )
    try:
        try:
            if old_mode is not None:
                os.fchmod(fd, stat.S_IMODE(old_mode) & 0o777)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=parent)
        raise


def edit_text(
    root_fd: int,
    parts: Sequence[str],
    old_text: str,
    new_text: str,
    *,
    replace_all: bool,
    cfg: FsConfig,
) -> int:
    """``edit_file``: read, replace in memory, write back atomically."""
    if not old_text:
        raise OperationError("old_text must not be empty", code="invalid_argument")
    raw = read_bytes(root_fd, parts, cfg)
    data, count = apply_edit(raw, old_text, new_text, replace_all=replace_all, where=where(parts))
    if len(data) > cfg.max_file_bytes:
        raise OperationError(
            f"the edited {where(parts)} would be over the {cfg.max_file_bytes}-byte limit",
            code="too_large",
        )
    _replace(root_fd, parts, data, cfg, create_parents=False)
    return count


def stat_path(root_fd: int, parts: Sequence[str], cfg: FsConfig) -> FileStat:
    """``stat``: an O_PATH open that does not follow a leaf symlink, then fstat."""
    fd = open_beneath(root_fd, parts, os.O_PATH | os.O_CLOEXEC, resolver=cfg.resolver)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    kind = file_type(st.st_mode)
    return FileStat(
        path=where(parts),
        type=kind,
        size=st.st_size if kind == "file" else 0,
        mtime=st.st_mtime,
        mode=stat.S_IMODE(st.st_mode),
    )


def mkdir(root_fd: int, parts: Sequence[str], parents: bool, cfg: FsConfig) -> None:
    """``mkdir``: one mkdirat in the resolved parent."""
    if not parts:
        if parents:
            return
        raise OperationError("/ already exists", code="exists")
    parent = _open_parent(root_fd, parts, cfg, parents)
    try:
        os.mkdir(parts[-1], 0o777, dir_fd=parent)
    except FileExistsError:
        existing = _lstat(parts[-1], parent)
        if parents and existing is not None and stat.S_ISDIR(existing.st_mode):
            return
        raise OperationError(f"{where(parts)} already exists", code="exists") from None
    except OSError as exc:
        raise oserror(exc, parts, "create directory") from None
    finally:
        os.close(parent)


def rm(root_fd: int, parts: Sequence[str], recursive: bool, cfg: FsConfig) -> None:
    """``rm``: unlink or rmdir the entry itself (a symlink is removed, never followed)."""
    if not parts:
        raise OperationError("the workspace root cannot be removed", code="invalid_argument")
    parent = _open_parent(root_fd, parts, cfg, False)
    try:
        st = _lstat(parts[-1], parent)
        if st is None:
            raise OperationError(f"{where(parts)} does not exist", code="not_found")
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(parts[-1], dir_fd=parent)
        elif recursive:
            # Iterative, fd-bounded, never following a symlink: the depth of
            # the tree is the agent's to choose.
            remove_tree_at(parent, parts[-1])
        else:
            try:
                os.rmdir(parts[-1], dir_fd=parent)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise OperationError(
                        f"{where(parts)} is a non-empty directory; pass recursive to remove it",
                        code="not_empty",
                    ) from None
                raise
    except OSError as exc:
        raise oserror(exc, parts, "remove") from None
    finally:
        os.close(parent)
