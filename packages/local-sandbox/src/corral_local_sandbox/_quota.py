"""The workspace disk quota, and the host-side sweep that keeps set-id bits out.

A command can fill the host disk with many files each under
``RLIMIT_FSIZE``, so after every command the workspace is measured: one
iterative walk, from directory fds, summing ``st_blocks`` (each inode once).
Over the quota, the command's stderr says so and every later command and
file-tool write is refused until files are removed (removal always works).
The "over quota" state is a flag file in the workspace's state directory,
so every process using the workspace honours it.

The same walk clears ``S_ISUID``/``S_ISGID`` on anything it finds: the
seccomp filter refuses to set those bits, and this is the second line
(a sandbox running as host root must never leave a root set-id file).

The walk descends by ``openat(child, O_NOFOLLOW)`` and climbs back by
``openat("..")``, checking the inode it lands on, so it holds one fd
whatever the depth, never follows a symlink, and never recurses.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import Final

import anyio
import anyio.to_thread
import attrs

from corral.provider import (
    CommandRequest,
    ExecResult,
    FileSystem,
    ForwardingFileSystem,
    ForwardingShell,
    OperationError,
    Shell,
)

__all__ = ["DiskQuota", "QuotaFileSystem", "QuotaShell", "Usage", "measure"]

_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_SETID: Final = stat.S_ISUID | stat.S_ISGID
_MIB: Final = 1024 * 1024
_ATTEMPTS: Final = 3


@attrs.frozen
class Usage:
    """What one walk of the workspace found.

    Attributes:
        bytes: Disk space used (``st_blocks`` * 512, hard links counted once).
        entries: Directory entries seen.
        stripped: Files and directories whose set-id bits were cleared.
    """

    bytes: int
    entries: int
    stripped: int


class _Raced(Exception):
    """A directory moved while it was walked; the walk starts over."""


def _strip(dir_fd: int, name: str, st: os.stat_result) -> bool:
    """Clear set-id bits on ``name``, checking it is still the inode that was seen."""
    flags = _DIR if stat.S_ISDIR(st.st_mode) else _FILE
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False
        os.fchmod(fd, stat.S_IMODE(now.st_mode) & ~_SETID)
        return True
    finally:
        os.close(fd)


def _scan(fd: int, seen: set[tuple[int, int]], usage: list[int]) -> list[str]:
    """Add one directory's entries to ``usage``; return its subdirectory names."""
    subdirs: list[str] = []
    with os.scandir(fd) as it:
        for entry in it:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # removed meanwhile
            usage[1] += 1
            mode = st.st_mode
            if mode & _SETID and (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                usage[2] += _strip(fd, entry.name, st)
            if stat.S_ISDIR(mode):
                subdirs.append(entry.name)
                continue
            if st.st_nlink > 1:
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            usage[0] += st.st_blocks * 512
    return subdirs


def _walk(root: str) -> Usage:
    fd = os.open(root, _DIR)
    usage = [os.fstat(fd).st_blocks * 512, 0, 0]
    seen: set[tuple[int, int]] = set()
    try:
        top = os.fstat(fd)
        # Each frame: (dev, ino) of a directory and the subdirectories still to visit.
        stack: list[tuple[tuple[int, int], list[str]]] = [
            ((top.st_dev, top.st_ino), _scan(fd, seen, usage))
        ]
        while stack:
            pending = stack[-1][1]
            if pending:
                try:
                    child = os.open(pending.pop(), _DIR, dir_fd=fd)
                except OSError:
                    # Listed a moment ago, now gone or not a directory: it may
                    # have moved somewhere already counted or not yet seen,
                    # so this walk's total cannot be trusted.
                    raise _Raced from None
                os.close(fd)
                fd = child
                st = os.fstat(fd)
                usage[0] += st.st_blocks * 512
                stack.append(((st.st_dev, st.st_ino), _scan(fd, seen, usage)))
                continue
            stack.pop()
            if not stack:
                break
            parent = os.open("..", _DIR, dir_fd=fd)
            os.close(fd)
            fd = parent
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != stack[-1][0]:
                raise _Raced
    finally:
        os.close(fd)
    return Usage(usage[0], usage[1], usage[2])


def measure(root: str) -> Usage:
    """Walk the workspace (blocking): its disk use, with set-id bits cleared on the way.

    Raises:
        OSError: The workspace root cannot be opened, or directories kept
            moving under the walk.
    """
    for _ in range(_ATTEMPTS - 1):
        with contextlib.suppress(_Raced):
            return _walk(root)
    try:
        return _walk(root)
    except _Raced:
        raise OSError("the workspace changed while it was measured") from None


class DiskQuota:
    """One workspace's quota: the limit, the walk, and the shared over-quota flag.

    Args:
        root: Host path of the workspace.
        flag_path: File whose existence means "over quota" (in the state directory).
        limit: The quota in bytes.
    """

    def __init__(self, root: str, flag_path: str, limit: int) -> None:
        self.root = root
        self.flag_path = flag_path
        self.limit = limit

    def flagged(self) -> bool:
        """Whether some process found the workspace over quota (one ``stat``)."""
        return os.path.lexists(self.flag_path)

    def update(self) -> Usage:
        """Measure, then set or clear the flag (blocking).

        A workspace that cannot be measured (a concurrent command keeps moving
        directories under the walk) is flagged: the quota fails closed, or a
        command racing the walk forever would keep it from ever applying.

        Raises:
            OSError: The workspace could not be measured (the flag is set).
        """
        try:
            usage = measure(self.root)
        except OSError:
            with contextlib.suppress(OSError):
                os.close(os.open(self.flag_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            raise
        if usage.bytes > self.limit:
            with contextlib.suppress(FileExistsError):
                os.close(os.open(self.flag_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.flag_path)
        return usage

    def message(self, usage: Usage) -> str:
        """The refusal every blocked command and write gets."""
        return (
            f"the workspace is over its disk quota ({usage.bytes // _MIB} MiB used of "
            f"{self.limit // _MIB} MiB); remove files (workspace_rm) to continue"
        )

    async def refuse_if_over(self) -> None:
        """Raise while the workspace is over quota; re-measure only when flagged.

        Raises:
            OperationError: ``policy_denied`` with the usage.
        """
        if not self.flagged():
            return
        try:
            usage = await anyio.to_thread.run_sync(self.update)
        except OSError:
            raise OperationError(
                "the workspace could not be measured against its disk quota (it kept changing "
                "while it was walked); try again when no other command is running",
                code="policy_denied",
            ) from None
        if usage.bytes > self.limit:
            raise OperationError(self.message(usage), code="policy_denied")


class QuotaShell(ForwardingShell):
    """Runs commands through ``inner`` unless over quota; measures after each one.

    Args:
        inner: The shell to decorate.
        quota: The workspace's quota.
    """

    def __init__(self, inner: Shell, quota: DiskQuota) -> None:
        super().__init__(inner)
        self._quota = quota

    async def run(self, request: CommandRequest) -> ExecResult:
        """Run one command, then measure the workspace and note an exceeded quota on stderr.

        Raises:
            OperationError: ``policy_denied`` while over quota; anything ``inner`` raises.
        """
        await self._quota.refuse_if_over()
        try:
            result = await self._inner.run(request)
        except BaseException:
            with anyio.CancelScope(shield=True), contextlib.suppress(OSError):
                await anyio.to_thread.run_sync(self._quota.update)
            raise
        notes = ""
        try:
            usage = await anyio.to_thread.run_sync(self._quota.update)
        except OSError:
            usage = None
            notes += (
                "corral: the workspace could not be measured against its disk quota; "
                "further commands and writes are refused until it can be\n"
            )
        if usage is not None and usage.stripped:
            notes += f"corral: cleared set-user/group-ID bits on {usage.stripped} file(s)\n"
        if usage is not None and usage.bytes > self._quota.limit:
            notes += (
                f"corral: {self._quota.message(usage)}; further commands and writes are refused\n"
            )
        if notes:
            result = attrs.evolve(result, stderr=result.stderr + notes)
        return result


class QuotaFileSystem(ForwardingFileSystem):
    """A FileSystem that refuses writes while the workspace is over quota; removal always works.

    Args:
        inner: The file tools to decorate.
        quota: The workspace's quota.
    """

    def __init__(self, inner: FileSystem, quota: DiskQuota) -> None:
        super().__init__(inner)
        self._quota = quota

    async def write_file(self, path: str, data: bytes) -> None:
        """Write a file unless over quota."""
        await self._quota.refuse_if_over()
        await self._inner.write_file(path, data)

    async def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        """Edit a file unless over quota."""
        await self._quota.refuse_if_over()
        return await self._inner.edit_file(path, old_text, new_text, replace_all=replace_all)

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        """Create a directory unless over quota."""
        await self._quota.refuse_if_over()
        await self._inner.mkdir(path, parents=parents)

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        """Remove (always allowed: it is how a workspace gets back under quota)."""
        await self._inner.rm(path, recursive=recursive)
        if self._quota.flagged():
            with contextlib.suppress(OSError):
                await anyio.to_thread.run_sync(self._quota.update)
