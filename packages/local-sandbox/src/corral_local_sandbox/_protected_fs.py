"""The file tools honour the protected paths too.

The file tools run on the host, outside the sandbox: without this guard a
model could plant ``.git/hooks/pre-commit`` with ``write_file`` instead of
``echo``. Reads, listings and searches pass through untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral import (
    FileEntry,
    FileStat,
    FileSystem,
    GrepOptions,
    GrepResult,
    Matcher,
    OperationError,
    path_parts,
)

from ._policy import ProtectedPath

__all__ = ["ProtectedFileSystem"]


class ProtectedFileSystem:
    """A FileSystem that refuses writes to, under, or removal of protected paths.

    Comparison is case-insensitive, so ``.GIT/hooks`` on a case-insensitive
    host filesystem is refused as well.

    Args:
        inner: The workspace's filesystem.
        protected: The protected paths.
    """

    def __init__(self, inner: FileSystem, protected: Sequence[ProtectedPath]) -> None:
        self._inner = inner
        self._protected = [tuple(p.path.casefold().split("/")) for p in protected]

    def _check(self, path: str, verb: str) -> None:
        parts = tuple(p.casefold() for p in path_parts(path))
        for prot in self._protected:
            if parts[: len(prot)] == prot:
                raise OperationError(
                    f"cannot {verb} {'/' + '/'.join(path_parts(path))}: it is a protected path "
                    "(VCS hooks/config, shell start-up, editor and agent configuration)",
                    code="policy_denied",
                )

    def _check_remove(self, path: str, recursive: bool) -> None:
        self._check(path, "remove")
        if recursive:
            parts = tuple(p.casefold() for p in path_parts(path))
            for prot in self._protected:
                if prot[: len(parts)] == parts:
                    raise OperationError(
                        "cannot remove a directory holding a protected path", code="policy_denied"
                    )

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Read a file (not restricted)."""
        return await self._inner.read_file(path, max_bytes=max_bytes)

    async def write_file(self, path: str, data: bytes) -> None:
        """Write a file unless it is, or lies under, a protected path."""
        self._check(path, "write")
        await self._inner.write_file(path, data)

    async def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        """Edit a file unless it is, or lies under, a protected path."""
        self._check(path, "edit")
        return await self._inner.edit_file(path, old_text, new_text, replace_all=replace_all)

    async def ls(self, path: str = "/") -> Sequence[FileEntry]:
        """List a directory (not restricted)."""
        return await self._inner.ls(path)

    async def glob(self, pattern: str, path: str = "/") -> Sequence[str]:
        """Glob (not restricted)."""
        return await self._inner.glob(pattern, path)

    async def grep(self, matcher: Matcher, options: GrepOptions) -> GrepResult:
        """Search (not restricted)."""
        return await self._inner.grep(matcher, options)

    async def stat(self, path: str) -> FileStat:
        """Stat (not restricted)."""
        return await self._inner.stat(path)

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        """Create a directory unless it is, or lies under, a protected path."""
        self._check(path, "create")
        await self._inner.mkdir(path, parents=parents)

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        """Remove unless the path is protected or (recursively) holds one."""
        if path_parts(path):  # the root: let the inner fs give the standard refusal
            self._check_remove(path, recursive)
        await self._inner.rm(path, recursive=recursive)
