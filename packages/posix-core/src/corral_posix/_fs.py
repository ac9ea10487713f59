"""TmpdirFileSystem: corral's FileSystem over a host directory, resolved in the kernel."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import anyio.to_thread

from corral.provider import (
    DEFAULT_MAX_FILE_BYTES,
    ConfigError,
    FileEntry,
    FileStat,
    GrepOptions,
    GrepResult,
    Matcher,
    OperationError,
    WorkspaceEvictedError,
    WorkspaceFailedError,
    path_parts,
)

from . import _fileops, _walk
from ._fileops import FsConfig
from ._resolve import Resolver, openat2_available

__all__ = ["TmpdirFileSystem"]

T = TypeVar("T")

_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class _RootHandle:
    """The root directory fd, closed only once no operation is using it.

    ``close``/``reattach`` may run while a worker thread still resolves a path
    beneath the old fd; closing it then could let the number be reused for an
    unrelated file mid-operation.
    """

    def __init__(self, path: str, provider_id: str | None) -> None:
        try:
            self.fd = os.open(path, _ROOT_FLAGS)
        except OSError as exc:
            raise WorkspaceFailedError(
                f"cannot open the workspace directory: {os.strerror(exc.errno or 0).lower()}",
                provider_id=provider_id,
                cause=exc,
            ) from None
        st = os.fstat(self.fd)
        self.ident = (st.st_dev, st.st_ino)
        self._users = 0
        self._retired = False
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        with self._lock:
            if self._retired:
                return False
            self._users += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            close = self._retired and self._users == 0
        if close:
            os.close(self.fd)

    def retire(self) -> None:
        with self._lock:
            if self._retired:
                return
            self._retired = True
            close = self._users == 0
        if close:
            os.close(self.fd)


class TmpdirFileSystem:
    """A :class:`corral.provider.FileSystem` confined beneath one host directory.

    The root is opened once as a directory fd and every path is resolved
    beneath it by the kernel (``openat2`` with ``RESOLVE_BENEATH``) or, where
    that is unavailable, one component at a time with ``O_NOFOLLOW``; see
    :func:`corral_posix.open_beneath`. Special files are refused after an
    ``fstat`` on an fd opened ``O_NONBLOCK``, sizes are capped before
    reading, writes are atomic renames, and walks never follow symlinks.

    A write to a file that has other hard links replaces this directory entry
    with a new inode: the other links keep the old content, so a hard link to
    a file outside the workspace can never be used to modify it.

    Args:
        root: The workspace directory on the host.
        max_file_bytes: Largest file read, written, edited or searched.
        allow_leaf_symlinks: Follow a symlink in the last component of
            read/write/edit/ls/glob/grep paths (still confined beneath the
            root). ``stat`` never follows one.
        max_walk_entries: Most entries a listing or walk visits.
        max_walk_depth: Deepest directory level a walk descends to.
        resolver: ``auto``, ``openat2`` or ``walk`` (see :func:`open_beneath`).
        provider_id: Stamped on :class:`corral.WorkspaceEvictedError`.

    Raises:
        WorkspaceFailedError: The root cannot be opened.
        ConfigError: ``resolver="openat2"`` on a system without it.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        allow_leaf_symlinks: bool = False,
        max_walk_entries: int = 100_000,
        max_walk_depth: int = 64,
        resolver: Resolver = "auto",
        provider_id: str | None = None,
    ) -> None:
        if resolver not in ("auto", "openat2", "walk"):
            raise ConfigError("resolver must be 'auto', 'openat2' or 'walk'")
        if resolver == "openat2" and not openat2_available():
            raise ConfigError("resolver 'openat2' is not available on this system")
        if resolver == "auto":
            resolver = "openat2" if openat2_available() else "walk"
        self._root_path = os.path.abspath(os.fspath(root))
        self._provider_id = provider_id
        self._cfg = FsConfig(
            resolver=resolver,
            allow_leaf_symlinks=allow_leaf_symlinks,
            max_file_bytes=max_file_bytes,
            max_walk_entries=max_walk_entries,
            max_walk_depth=max_walk_depth,
        )
        self._handle: _RootHandle | None = _RootHandle(self._root_path, provider_id)

    @property
    def root_path(self) -> str:
        """Absolute host path of the workspace directory."""
        return self._root_path

    @property
    def resolver(self) -> str:
        """The resolver in use: ``openat2`` or ``walk``."""
        return self._cfg.resolver

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._handle is None

    def reattach(self) -> None:
        """Reopen the root fd from :attr:`root_path` (after a restore swapped the directory)."""
        fresh = _RootHandle(self._root_path, self._provider_id)
        old, self._handle = self._handle, fresh
        if old is not None:
            old.retire()

    def close(self) -> None:
        """Close the root fd; later operations raise ``OperationError(code="closed")``."""
        old, self._handle = self._handle, None
        if old is not None:
            old.retire()

    def _run(self, op: Callable[[int], T]) -> T:
        """Run ``op(root_fd)`` in this (worker) thread after checking the root is alive."""
        handle = self._handle
        if handle is None or not handle.acquire():
            raise OperationError("the file system is closed", code="closed")
        try:
            self._check_root(handle)
            return op(handle.fd)
        finally:
            handle.release()

    def _check_root(self, handle: _RootHandle) -> None:
        # A deleted root still answers through its fd, as an empty directory;
        # a root replaced under the same path is someone else's directory.
        gone = os.fstat(handle.fd).st_nlink == 0
        if not gone:
            try:
                st = os.stat(self._root_path)
                gone = (st.st_dev, st.st_ino) != handle.ident
            except OSError:
                gone = True
        if gone:
            raise WorkspaceEvictedError(
                "the workspace directory no longer exists", provider_id=self._provider_id
            )

    async def _call(self, op: Callable[[int], T]) -> T:
        return await anyio.to_thread.run_sync(self._run, op)

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Return the whole content of a regular file (at most ``max_bytes``)."""
        parts = path_parts(path)
        cfg = self._cfg
        cap = cfg.max_file_bytes if max_bytes is None else min(max_bytes, cfg.max_file_bytes)
        return await self._call(lambda fd: _fileops.read_bytes(fd, parts, cfg, cap))

    async def write_file(self, path: str, data: bytes) -> None:
        """Atomically create or replace a file, creating parent directories."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise OperationError("data must be bytes", code="invalid_argument")
        parts = path_parts(path)
        cfg = self._cfg
        await self._call(lambda fd: _fileops.write_atomic(fd, parts, bytes(data), cfg))

    async def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        """Replace text in a UTF-8 file atomically; return how many replacements."""
        parts = path_parts(path)
        cfg = self._cfg
        return await self._call(
            lambda fd: _fileops.edit_text(
                fd, parts, old_text, new_text, replace_all=replace_all, cfg=cfg
            )
        )

    async def ls(self, path: str = "/") -> Sequence[FileEntry]:
        """List a directory, sorted by name; symlinks are listed, not followed."""
        parts = path_parts(path)
        cfg = self._cfg
        return await self._call(lambda fd: _walk.list_dir(fd, parts, cfg))

    async def glob(self, pattern: str, path: str = "/") -> Sequence[str]:
        """Return sorted paths under ``path`` matching ``pattern``."""
        parts = path_parts(path)
        cfg = self._cfg
        return await self._call(lambda fd: _walk.glob_paths(fd, parts, pattern, cfg))

    async def grep(self, matcher: Matcher, options: GrepOptions) -> GrepResult:
        """Search regular files line by line with ``matcher``."""
        path_parts(options.path)
        cfg = self._cfg
        return await self._call(lambda fd: _walk.grep_tree(fd, matcher, options, cfg))

    async def stat(self, path: str) -> FileStat:
        """Describe a path without following a leaf symlink."""
        parts = path_parts(path)
        cfg = self._cfg
        return await self._call(lambda fd: _fileops.stat_path(fd, parts, cfg))

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        """Create a directory."""
        parts = path_parts(path)
        cfg = self._cfg
        await self._call(lambda fd: _fileops.mkdir(fd, parts, parents, cfg))

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, symlink or directory (recursively without following symlinks)."""
        parts = path_parts(path)
        cfg = self._cfg
        await self._call(lambda fd: _fileops.rm(fd, parts, recursive, cfg))
