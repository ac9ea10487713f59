"""Depth-first descent of a directory tree through fds, in constant stack and fds.

A workspace's contents decide how deep its tree is: an agent can nest
10,000 directories with one command. Anything that recurses per level
(CPython's own ``shutil.rmtree`` before 3.13, ``os.fwalk``, a recursive
generator) then dies with ``RecursionError``, and anything that keeps one fd
per level hits ``EMFILE``. :class:`DirChain` keeps neither: it holds the fd
of the current directory plus the (borrowed) top, and remembers only the
name and ``(st_dev, st_ino)`` of each ancestor. Going down opens the child
with ``O_NOFOLLOW | O_DIRECTORY`` from the current fd (a symlink is never
entered); going up opens ``..`` and accepts it only if it is the very
directory we came from. If a concurrent rename moved the current directory,
the parent is found again from the top by name, checking every inode on the
way, and the walk fails cleanly if that is impossible: no step ever acts on
a directory it has not identified, and none uses a path string.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import Final, Literal

from corral.provider import OperationError

__all__ = ["DIR_FLAGS", "DirChain", "remove_tree_at"]

DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS: Final = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_GONE: Final = frozenset({errno.ENOENT, errno.ELOOP, errno.ENOTDIR})
_DENIED: Final = frozenset({errno.EACCES, errno.EPERM})
_MAX_REFILLS: Final = 1000
_MAX_SWAPS: Final = 100
# unlink of what became a directory, rmdir of what stopped being one, or of a
# directory something was swapped into after it was emptied
_SWAPPED: Final = frozenset({errno.EISDIR, errno.ENOTDIR, errno.ENOTEMPTY})

Descent = Literal["entered", "gone", "loop"]


def _key(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def _moved() -> OperationError:
    return OperationError(
        "the directory tree changed while it was being walked; try again", code="failed"
    )


class DirChain:
    """The current directory of a depth-first descent below a top directory fd.

    Args:
        top_fd: The top directory; borrowed (never closed here) and kept open
            for the whole descent, since finding a moved parent starts there.
    """

    def __init__(self, top_fd: int) -> None:
        self._top = top_fd
        self.fd = top_fd
        self._keys: list[tuple[int, int]] = [_key(os.fstat(top_fd))]
        self._names: list[str] = []
        self._on_path = {self._keys[0]}

    @property
    def depth(self) -> int:
        """Levels below the top (0 at the top)."""
        return len(self._names)

    @property
    def name(self) -> str:
        """The current directory's name in its parent (``""`` at the top)."""
        return self._names[-1] if self._names else ""

    def descend(self, name: str) -> Descent:
        """Enter the subdirectory ``name`` of the current directory.

        Returns:
            ``"entered"``; ``"gone"`` when it vanished or is no longer a real
            directory (a symlink swapped in is never followed); ``"loop"``
            when it is a directory already on the current path (a bind mount).

        Raises:
            OSError: Any other failure to open it (``EACCES``, ``EMFILE``).
        """
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in _GONE:
                return "gone"
            raise
        try:
            key = _key(os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        if key in self._on_path:
            os.close(fd)
            return "loop"
        self._leave()
        self.fd = fd
        self._keys.append(key)
        self._names.append(name)
        self._on_path.add(key)
        return "entered"

    def ascend(self) -> None:
        """Go back to the parent of the current directory.

        Raises:
            OperationError: The parent can no longer be identified (the tree
                was moved around concurrently).
            ValueError: Already at the top.
        """
        if not self._names:
            raise ValueError("already at the top of the descent")
        up = self._top if len(self._names) == 1 else self._open_parent()
        self._leave()
        self.fd = up
        self._on_path.discard(self._keys.pop())
        self._names.pop()

    def close(self) -> None:
        """Release the current directory fd (the top stays the caller's)."""
        self._leave()
        self.fd = self._top

    def _leave(self) -> None:
        if self.fd != self._top:
            os.close(self.fd)

    def _open_parent(self) -> int:
        want = self._keys[-2]
        try:
            up = os.open("..", DIR_FLAGS, dir_fd=self.fd)
        except OSError:
            return self._reopen_parent()
        if _key(os.fstat(up)) == want:
            return up
        os.close(up)
        return self._reopen_parent()

    def _reopen_parent(self) -> int:
        # The current directory was moved: walk down again from the top by
        # name, accepting each step only if it is the inode recorded then.
        fd = self._top
        for name, key in zip(self._names[:-1], self._keys[1:-1], strict=True):
            nxt = self._step(fd, name, key)
            if fd != self._top:
                os.close(fd)
            if nxt is None:
                raise _moved()
            fd = nxt
        return fd

    @staticmethod
    def _step(fd: int, name: str, key: tuple[int, int]) -> int | None:
        try:
            nxt = os.open(name, DIR_FLAGS, dir_fd=fd)
        except OSError:
            return None
        if _key(os.fstat(nxt)) != key:
            os.close(nxt)
            return None
        return nxt


def _make_accessible(parent_fd: int, name: str) -> None:
    """Give a directory of ours (mode 000, 500) back its owner's rwx.

    The directory is pinned with an ``O_PATH | O_NOFOLLOW`` fd and changed
    through ``/proc/self/fd``, so a symlink swapped in is never chmodded.
    """
    with contextlib.suppress(OSError):
        fd = os.open(name, _PATH_FLAGS, dir_fd=parent_fd)
        try:
            os.chmod(f"/proc/self/fd/{fd}", 0o700)
        finally:
            os.close(fd)


def _retry_writable(dir_fd: int, action: str, name: str) -> None:
    """``unlink``/``rmdir`` ``name``; on a permission error make the directory
    writable (the agent may have chmodded it) and try once more."""
    fn = os.unlink if action == "unlink" else os.rmdir
    try:
        fn(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in _DENIED:
            raise
        with contextlib.suppress(OSError):
            os.fchmod(dir_fd, 0o700)
        with contextlib.suppress(FileNotFoundError):
            fn(name, dir_fd=dir_fd)


def _clear_files(dir_fd: int) -> list[str]:
    """Unlink every non-directory in a directory; return its subdirectories."""
    subdirs: list[str] = []
    with os.scandir(dir_fd) as it:
        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    for name, is_dir in entries:
        if is_dir:
            subdirs.append(name)
            continue
        try:
            _retry_writable(dir_fd, "unlink", name)
        except IsADirectoryError:
            subdirs.append(name)  # replaced by a directory since the listing
    return subdirs


def _enter(chain: DirChain, name: str) -> Descent:
    try:
        return chain.descend(name)
    except OSError as exc:
        if exc.errno not in _DENIED:
            raise
    _make_accessible(chain.fd, name)
    return chain.descend(name)


def remove_tree_at(parent_fd: int, name: str) -> None:
    """Remove ``name`` (a directory tree, or any other entry) from ``parent_fd``.

    Iterative and fd-bounded at any depth (see :class:`DirChain`); symlinks
    are unlinked, never followed; directories made read-only or unsearchable
    by the agent are made accessible again. A missing entry is fine.

    Raises:
        OSError: An entry cannot be removed.
        OperationError: The tree was moved concurrently so that the removal
            cannot safely go on, or kept refilling while being removed.
    """
    # A process may swap the entry between a directory and anything else at
    # any moment (rename exchange): every step that acts on its type looks
    # again when the kernel says the type changed, a bounded number of times.
    for _ in range(_MAX_SWAPS):
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        try:
            if stat.S_ISDIR(st.st_mode):
                _remove_dir_at(parent_fd, name)
            else:
                _retry_writable(parent_fd, "unlink", name)
        except OSError as exc:
            if exc.errno not in _SWAPPED:
                raise
        else:
            return
    raise OperationError(
        "an entry kept changing between a directory and a file while it was being removed",
        code="failed",
    )


def _remove_dir_at(parent_fd: int, name: str) -> None:
    try:
        top = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in _GONE:
            _retry_writable(parent_fd, "unlink", name)
            return
        if exc.errno not in _DENIED:
            raise
        _make_accessible(parent_fd, name)
        top = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    try:
        _empty_tree(top)
    finally:
        os.close(top)
    _retry_writable(parent_fd, "rmdir", name)


def _empty_tree(top: int) -> None:
    chain = DirChain(top)
    refills = 0
    try:
        # pending[i]: subdirectories still to remove at depth i.
        pending = [_clear_files(top)]
        while True:
            if pending[-1]:
                child = pending[-1].pop()
                outcome = _enter(chain, child)
                if outcome == "loop":
                    raise OperationError(
                        "the directory tree loops back on itself; it cannot be removed",
                        code="failed",
                    )
                if outcome == "entered":
                    pending.append(_clear_files(chain.fd))
                continue
            if chain.depth == 0:
                return
            pending.pop()
            done = chain.name
            chain.ascend()
            try:
                _retry_writable(chain.fd, "rmdir", done)
            except OSError as exc:
                # ENOTDIR: swapped for a symlink or file since it was entered.
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                    raise
                refills += 1
                if refills > _MAX_REFILLS:
                    raise OperationError(
                        "the directory tree kept filling up while it was being removed",
                        code="failed",
                    ) from None
                pending[-1].append(done)  # written to meanwhile: go through it again
    finally:
        chain.close()
