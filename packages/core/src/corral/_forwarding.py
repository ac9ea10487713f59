"""Forwarding bases for module wrappers.

Providers decorate modules: a filesystem that refuses writes to protected
paths or over a disk quota, or hands written files to a container user; a
shell that checks the workspace around every command. Written by hand, each
such wrapper repeats every method of the protocol, and one a protocol grows
later silently lacks the new method. Subclass :class:`ForwardingFileSystem`
or :class:`ForwardingShell` instead and override only what changes; every
other call goes to ``inner`` unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._data import CommandRequest, ExecResult, FileEntry, FileStat, GrepOptions, GrepResult
from ._protocols import FileSystem, Shell
from ._regex import Matcher

__all__ = ["ForwardingFileSystem", "ForwardingShell"]


class ForwardingFileSystem:
    """A :class:`FileSystem` that forwards every call to ``inner``.

    Subclass it to decorate a filesystem and override only the methods whose
    behaviour changes; a method added to the protocol later then forwards
    by default instead of being missing from every wrapper.

    Args:
        inner: The filesystem being decorated.
    """

    def __init__(self, inner: FileSystem) -> None:
        self._inner = inner

    @property
    def inner(self) -> FileSystem:
        """The decorated filesystem."""
        return self._inner

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Read a file through ``inner``."""
        return await self._inner.read_file(path, max_bytes=max_bytes)

    async def write_file(self, path: str, data: bytes) -> None:
        """Write a file through ``inner``."""
        await self._inner.write_file(path, data)

    async def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        """Edit a file through ``inner``; return how many replacements."""
        return await self._inner.edit_file(path, old_text, new_text, replace_all=replace_all)

    async def ls(self, path: str = "/") -> Sequence[FileEntry]:
        """List a directory through ``inner``."""
        return await self._inner.ls(path)

    async def glob(self, pattern: str, path: str = "/") -> Sequence[str]:
        """Glob through ``inner``."""
        return await self._inner.glob(pattern, path)

    async def grep(self, matcher: Matcher, options: GrepOptions) -> GrepResult:
        """Search file contents through ``inner``."""
        return await self._inner.grep(matcher, options)

    async def stat(self, path: str) -> FileStat:
        """Describe a path through ``inner``."""
        return await self._inner.stat(path)

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        """Create a directory through ``inner``."""
        await self._inner.mkdir(path, parents=parents)

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        """Remove a path through ``inner``."""
        await self._inner.rm(path, recursive=recursive)

    def close(self) -> None:
        """Close ``inner`` when it can be closed (host filesystems hold a directory fd)."""
        close = getattr(self._inner, "close", None)
        if callable(close):
            close()


class ForwardingShell:
    """A :class:`Shell` that forwards every command to ``inner``.

    Subclass it to decorate a shell (checks around each command, notes on
    its result) and override :meth:`run`; :meth:`aclose` already forwards,
    so the decorated shell's running commands die when the workspace closes.

    Args:
        inner: The shell being decorated.
    """

    def __init__(self, inner: Shell) -> None:
        self._inner = inner

    @property
    def inner(self) -> Shell:
        """The decorated shell."""
        return self._inner

    async def run(self, request: CommandRequest) -> ExecResult:
        """Run one command through ``inner``."""
        return await self._inner.run(request)

    async def aclose(self) -> None:
        """Close ``inner`` when it can be closed (kills its running commands)."""
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            await aclose()
