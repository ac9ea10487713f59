"""Keeping a bind-mounted workspace writable by the container's non-root user.

When the host process is root, files it writes are root-owned and the
container user could not change them. After each host write the touched
path is handed to the container user, walking from the workspace root with
``O_NOFOLLOW`` directory fds so a symlink planted by the container can
never redirect the chown outside the workspace.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Final

import anyio.to_thread

from corral.provider import FileSystem, ForwardingFileSystem, path_parts

__all__ = ["OwnedFileSystem", "chown_path", "prepare_root"]

_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def prepare_root(root: str, uid: int, gid: int) -> None:
    """Let the container user write the workspace root while the host keeps owning it."""
    fd = os.open(root, _DIR)
    try:
        if os.geteuid() == 0:
            os.fchown(fd, 0, gid)
            os.fchmod(fd, 0o2770)
        elif os.fstat(fd).st_uid != uid:
            os.fchmod(fd, 0o2777)
    finally:
        os.close(fd)


def chown_path(root: str, parts: Sequence[str], uid: int, gid: int) -> None:
    """Give every component of ``parts`` under ``root`` to ``uid:gid`` (not the root itself)."""
    fd = os.open(root, _DIR)
    try:
        for i, name in enumerate(parts):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return
            if st.st_uid != uid or st.st_gid != gid:
                os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
            if i == len(parts) - 1:
                return
            try:
                nxt = os.open(name, _DIR, dir_fd=fd)
            except OSError:
                return
            os.close(fd)
            fd = nxt
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


class OwnedFileSystem(ForwardingFileSystem):
    """A host FileSystem whose writes end up owned by the container user.

    Only the calls that create or replace a path differ from ``inner``:
    each hands what it touched to the container user afterwards.

    Args:
        inner: posix-core's TmpdirFileSystem over the workspace root.
        root: The workspace root on the host.
        uid: Container user id.
        gid: Container group id.
    """

    def __init__(self, inner: FileSystem, root: str, uid: int, gid: int) -> None:
        super().__init__(inner)
        self._root = root
        self._uid = uid
        self._gid = gid

    async def _own(self, path: str) -> None:
        parts = path_parts(path)
        await anyio.to_thread.run_sync(chown_path, self._root, parts, self._uid, self._gid)

    async def write_file(self, path: str, data: bytes) -> None:
        """Write a file, then hand it (and created parents) to the container user."""
        await self._inner.write_file(path, data)
        await self._own(path)

    async def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        """Edit a file, then hand the replaced file to the container user."""
        count = await self._inner.edit_file(path, old_text, new_text, replace_all=replace_all)
        await self._own(path)
        return count

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        """Create a directory owned by the container user."""
        await self._inner.mkdir(path, parents=parents)
        await self._own(path)
