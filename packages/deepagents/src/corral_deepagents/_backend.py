"""``CorralBackend``: deepagents' ``SandboxBackendProtocol`` on a corral session."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import anyio.to_thread
from deepagents.backends.protocol import (
    DeleteResult,
    EditResult,
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
    GlobResult,
    GrepResult,
    LsResult,
    ReadResult,
    SandboxBackendProtocol,
    WriteResult,
)

import corral
from corral.sync import SyncWorkspaceSession

from ._files import Files
from ._shell import execute

__all__ = ["DEFAULT_MAX_FILE_BYTES", "CorralBackend"]

T = TypeVar("T")

DEFAULT_MAX_FILE_BYTES: Final = 100 * 1024 * 1024
"""The largest file the backend reads, writes, uploads or downloads whole (100 MiB)."""


class CorralBackend(SandboxBackendProtocol):
    """A deepagents sandbox backend (files and shell) on any corral workspace.

    Files go through the workspace's ``fs`` module; commands through the
    session's ``workspace_run`` tool, so the session's shell policy holds for
    the agent's ``execute`` as for any tool call. Paths are absolute and mean
    the same file in both: a path under the workspace's mount path
    (``details()["workspace_path"]``: ``/workspace`` on local-sandbox and
    docker, the host directory on local-bash, ``/`` on in-memory) names the
    workspace file below it; any other path is refused with ``invalid_path``.
    A session whose fs policy is read-only gets ``permission_denied`` for
    every change.

    Every method exists in a blocking and an async (``a``-prefixed) form.
    With a ``corral.sync`` session both work, from any thread or event loop
    (the async ones wait in a worker thread). With an async
    ``corral.WorkspaceSession`` only the async methods work, on the
    session's own event loop; the blocking ones raise ``NotImplementedError``
    because they cannot wait for that loop without stalling it.

    Args:
        session: An open ``corral.sync`` or ``corral`` session whose workspace
            declares ``fs`` (and ``shell`` for ``execute``). It stays owned
            by the caller, who closes it.
        max_file_bytes: The largest file one call reads, writes, uploads or
            downloads (the whole file is held in memory).

    Raises:
        TypeError: ``session`` is not a corral session.
    """

    def __init__(
        self,
        session: corral.WorkspaceSession | SyncWorkspaceSession,
        *,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    ) -> None:
        if isinstance(session, SyncWorkspaceSession):
            self._sync: SyncWorkspaceSession | None = session
            self._session = session.session
        elif isinstance(session, corral.WorkspaceSession):
            self._sync = None
            self._session = session
        else:
            raise TypeError("session must be a corral.WorkspaceSession or a corral.sync session")
        self._files = Files(self._session, max_file_bytes=max_file_bytes)

    def _block(self, fn: Callable[..., Awaitable[T]], *args: object) -> T:
        if self._sync is None:
            raise NotImplementedError(
                "this backend wraps an async corral session: call the async methods "
                "(aread, awrite, aexecute...), or open the workspace with corral.sync"
            )
        return self._sync.portal.call(fn, *args)

    async def _await(self, fn: Callable[..., Awaitable[T]], *args: object) -> T:
        if self._sync is None:
            return await fn(*args)
        # The session lives on its portal's loop; wait for it off this loop.
        return await anyio.to_thread.run_sync(self._sync.portal.call, fn, *args)

    @property
    def id(self) -> str:
        """The workspace's id (``corral-<id>``), or the session's before it opened."""
        snapshot = self._sync.describe() if self._sync else self._session.registry.describe()
        return f"corral-{snapshot.workspace_id or snapshot.session_id}"

    # -- commands ---------------------------------------------------------

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run a shell command in the workspace (cwd: the mount path); stdout then stderr.

        ``timeout`` None or 0 takes the shell policy's default; more than its
        ceiling is an error output. ``exit_code`` is None when the command
        did not run or was killed.
        """
        return self._block(execute, self._session, command, timeout)

    async def aexecute(
        self,
        command: str,
        *,
        timeout: int | None = None,  # noqa: ASYNC109 -- deepagents' signature, forwarded to corral
    ) -> ExecuteResponse:
        """Async ``execute``."""
        return await self._await(execute, self._session, command, timeout)

    # -- files ------------------------------------------------------------

    def ls(self, path: str) -> LsResult:
        """A directory's entries (absolute paths, ``is_dir``, ``size``)."""
        return self._block(self._files.ls, path)

    async def als(self, path: str) -> LsResult:
        """Async ``ls``."""
        return await self._await(self._files.ls, path)

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        """Lines ``offset`` (0-based) to ``offset + limit`` of a text file; binary as base64.

        Text pages are capped at deepagents' 500 KiB with its truncation
        note; binary files over 500 KiB are an error, as in deepagents'
        sandboxes.
        """
        return self._block(self._files.read, file_path, offset, limit)

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        """Async ``read``."""
        return await self._await(self._files.read, file_path, offset, limit)

    def write(self, file_path: str, content: str) -> WriteResult:
        """Create or replace a UTF-8 text file, creating its parent directories."""
        return self._block(self._files.write, file_path, content)

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        """Async ``write``."""
        return await self._await(self._files.write, file_path, content)

    def edit(
        self,
        file_path: str,
        old_string: str,
        new_string: str,
        replace_all: bool = False,
    ) -> EditResult:
        """Replace ``old_string`` (unique unless ``replace_all``) atomically."""
        return self._block(self._files.edit, file_path, old_string, new_string, replace_all)

    async def aedit(
        self,
        file_path: str,
        old_string: str,
        new_string: str,
        replace_all: bool = False,
    ) -> EditResult:
        """Async ``edit``."""
        return await self._await(self._files.edit, file_path, old_string, new_string, replace_all)

    def delete(self, file_path: str) -> DeleteResult:
        """Remove a file or a whole directory tree (never the workspace root)."""
        error = self._block(self._files.delete, file_path)
        return DeleteResult(error=error) if error else DeleteResult(path=file_path)

    async def adelete(self, file_path: str) -> DeleteResult:
        """Async ``delete``."""
        error = await self._await(self._files.delete, file_path)
        return DeleteResult(error=error) if error else DeleteResult(path=file_path)

    def grep(
        self,
        pattern: str,
        path: str | None = None,
        glob: str | None = None,
        *,
        max_count: int | None = None,
    ) -> GrepResult:
        """Lines holding the literal ``pattern`` under ``path`` (the workspace by default).

        ``glob`` filters files with deepagents' include-glob rules; at most
        ``max_count`` matches (10,000 without it), ``truncated`` when more exist.
        """
        return self._block(self._files.grep, pattern, path, glob, max_count)

    async def agrep(
        self,
        pattern: str,
        path: str | None = None,
        glob: str | None = None,
        *,
        max_count: int | None = None,
    ) -> GrepResult:
        """Async ``grep``."""
        return await self._await(self._files.grep, pattern, path, glob, max_count)

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        """Regular files under ``path`` matching ``pattern`` (deepagents' glob rules), absolute."""
        return self._block(self._files.glob, pattern, path)

    async def aglob(self, pattern: str, path: str | None = None) -> GlobResult:
        """Async ``glob``."""
        return await self._await(self._files.glob, pattern, path)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write each ``(path, bytes)`` whole, creating parents; one response per file, in order."""
        return self._block(self._files.upload, files)

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Async ``upload_files``."""
        return await self._await(self._files.upload, files)

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Each file's bytes, or a ``FileOperationError``; one response per path, in order."""
        return self._block(self._files.download, paths)

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Async ``download_files``."""
        return await self._await(self._files.download, paths)
