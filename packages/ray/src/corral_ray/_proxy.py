"""Driver-side modules: each method is one call to the workspace's node agent.

The built-in protocols (``FileSystem``, ``Shell``, ``Snapshotter`` /
``Versions``, ``CodeInterpreter``) are implemented method for method, so
the proxies are exactly what the tool layer and the conformance suite
expect. Any other module the inner workspace has (``process``, a third
party's) is forwarded generically: every public method becomes one call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from corral.provider import (
    CommandRequest,
    ExecResult,
    FileEntry,
    FileStat,
    GrepOptions,
    GrepResult,
    Matcher,
    OperationError,
    SnapshotInfo,
    VersionChange,
    WorkspaceRef,
)

from ._channel import Channel

__all__ = [
    "CodeProxy",
    "FileSystemProxy",
    "GenericProxy",
    "ShellProxy",
    "SnapshotProxy",
    "VersionsProxy",
]

WrapRef = Callable[[Any], WorkspaceRef]


class FileSystemProxy:
    """:class:`corral.provider.FileSystem` over the agent (file contents as Ray objects)."""

    def __init__(self, channel: Channel) -> None:
        self._c = channel

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """See :meth:`corral.provider.FileSystem.read_file`."""
        data: bytes = await self._c.call("fs", "read_file", path, max_bytes=max_bytes)
        return data

    async def write_file(self, path: str, data: bytes) -> None:
        """See :meth:`corral.provider.FileSystem.write_file`."""
        await self._c.call("fs", "write_file", path, bytes(data))

    async def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        """See :meth:`corral.provider.FileSystem.edit_file`."""
        count: int = await self._c.call(
            "fs", "edit_file", path, old_text, new_text, replace_all=replace_all
        )
        return count

    async def ls(self, path: str = "/") -> Sequence[FileEntry]:
        """See :meth:`corral.provider.FileSystem.ls`."""
        entries: Sequence[FileEntry] = await self._c.call("fs", "ls", path)
        return entries

    async def glob(self, pattern: str, path: str = "/") -> Sequence[str]:
        """See :meth:`corral.provider.FileSystem.glob`."""
        paths: Sequence[str] = await self._c.call("fs", "glob", pattern, path)
        return paths

    async def grep(self, matcher: Matcher, options: GrepOptions) -> GrepResult:
        """See :meth:`corral.provider.FileSystem.grep` (the compiled matcher travels pickled)."""
        try:
            result: GrepResult = await self._c.call("fs", "grep", matcher, options)
        except TypeError:
            raise OperationError(
                "the compiled pattern cannot be sent to the workspace's node",
                code="invalid_argument",
            ) from None
        return result

    async def stat(self, path: str) -> FileStat:
        """See :meth:`corral.provider.FileSystem.stat`."""
        info: FileStat = await self._c.call("fs", "stat", path)
        return info

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        """See :meth:`corral.provider.FileSystem.mkdir`."""
        await self._c.call("fs", "mkdir", path, parents=parents)

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        """See :meth:`corral.provider.FileSystem.rm`."""
        await self._c.call("fs", "rm", path, recursive=recursive)


class ShellProxy:
    """:class:`corral.provider.Shell` over the agent; the inner shell enforces the request."""

    def __init__(self, channel: Channel) -> None:
        self._c = channel

    async def run(self, request: CommandRequest) -> ExecResult:
        """See :meth:`corral.provider.Shell.run`."""
        result: ExecResult = await self._c.call("shell", "run", request)
        return result


class SnapshotProxy:
    """:class:`corral.provider.Snapshotter` over the agent; returned refs are ray refs."""

    def __init__(self, channel: Channel, wrap: WrapRef, module: str = "snapshot") -> None:
        self._c = channel
        self._wrap = wrap
        self._m = module

    async def snapshot(self, label: str | None = None) -> SnapshotInfo:
        """See :meth:`corral.provider.Snapshotter.snapshot`."""
        info: SnapshotInfo = await self._c.call(self._m, "snapshot", label)
        return info

    async def restore(self, snapshot_id: str) -> WorkspaceRef:
        """See :meth:`corral.provider.Snapshotter.restore`."""
        return self._wrap(await self._c.call(self._m, "restore", snapshot_id))

    async def list(self) -> Sequence[SnapshotInfo]:
        """See :meth:`corral.provider.Snapshotter.list`."""
        infos: Sequence[SnapshotInfo] = await self._c.call(self._m, "list")
        return infos

    async def delete(self, snapshot_id: str) -> None:
        """See :meth:`corral.provider.Snapshotter.delete`."""
        await self._c.call(self._m, "delete", snapshot_id)

    async def branch(self, snapshot_id: str) -> WorkspaceRef:
        """See :meth:`corral.provider.Snapshotter.branch` (the branch lives on the same node)."""
        return self._wrap(await self._c.call(self._m, "branch", snapshot_id))


class VersionsProxy(SnapshotProxy):
    """:class:`corral.provider.Versions` over the agent."""

    async def read_file_at(
        self, snapshot_id: str, path: str, *, max_bytes: int | None = None
    ) -> bytes:
        """See :meth:`corral.provider.Versions.read_file_at`."""
        data: bytes = await self._c.call(
            self._m, "read_file_at", snapshot_id, path, max_bytes=max_bytes
        )
        return data

    async def ls_at(self, snapshot_id: str, path: str = "/") -> Sequence[FileEntry]:
        """See :meth:`corral.provider.Versions.ls_at`."""
        entries: Sequence[FileEntry] = await self._c.call(self._m, "ls_at", snapshot_id, path)
        return entries

    async def stat_at(self, snapshot_id: str, path: str) -> FileStat:
        """See :meth:`corral.provider.Versions.stat_at`."""
        info: FileStat = await self._c.call(self._m, "stat_at", snapshot_id, path)
        return info

    async def grep_at(self, snapshot_id: str, matcher: Matcher, options: GrepOptions) -> GrepResult:
        """See :meth:`corral.provider.Versions.grep_at`."""
        result: GrepResult = await self._c.call(self._m, "grep_at", snapshot_id, matcher, options)
        return result

    async def diff(self, a: str, b: str | None = None) -> Sequence[VersionChange]:
        """See :meth:`corral.provider.Versions.diff`."""
        changes: Sequence[VersionChange] = await self._c.call(self._m, "diff", a, b)
        return changes


class CodeProxy:
    """:class:`corral.provider.CodeInterpreter` over the agent (any further method forwarded)."""

    def __init__(self, channel: Channel, module: str, languages: Sequence[str]) -> None:
        self._c = channel
        self._m = module
        self._languages = frozenset(languages)

    @property
    def languages(self) -> frozenset[str]:
        """Languages the inner interpreter accepts."""
        return self._languages

    async def run_code(self, language: str, code: str, *, timeout_s: float) -> ExecResult:
        """See :meth:`corral.provider.CodeInterpreter.run_code`."""
        result: ExecResult = await self._c.call(
            self._m, "run_code", language, code, timeout_s=timeout_s
        )
        return result

    async def create_context(self, language: str) -> str:
        """See :meth:`corral.provider.CodeInterpreter.create_context`."""
        context: str = await self._c.call(self._m, "create_context", language)
        return context

    async def run_in_context(self, context_id: str, code: str, *, timeout_s: float) -> ExecResult:
        """See :meth:`corral.provider.CodeInterpreter.run_in_context`."""
        result: ExecResult = await self._c.call(
            self._m, "run_in_context", context_id, code, timeout_s=timeout_s
        )
        return result

    async def delete_context(self, context_id: str) -> None:
        """See :meth:`corral.provider.CodeInterpreter.delete_context`."""
        await self._c.call(self._m, "delete_context", context_id)

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        return _forward(self._c, self._m, name)


class GenericProxy:
    """Any other module (``process``, a third party's): each public method is one agent call.

    Only coroutine methods can be forwarded; a module whose protocol has
    properties or async iterators needs a dedicated proxy.
    """

    def __init__(self, channel: Channel, module: str) -> None:
        self._c = channel
        self._m = module

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        return _forward(self._c, self._m, name)


def _forward(channel: Channel, module: str, name: str) -> Callable[..., Awaitable[Any]]:
    if name.startswith("_"):
        raise AttributeError(name)

    async def method(*args: Any, **kwargs: Any) -> Any:
        return await channel.call(module, name, *args, **kwargs)

    method.__name__ = name
    return method
