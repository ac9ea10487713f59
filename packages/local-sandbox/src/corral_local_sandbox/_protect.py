"""Turning protected workspace paths into bubblewrap mounts.

Each protected path is bound read-only onto itself. A path that does not
exist yet is first created empty on the host (an empty file, or an empty
directory for directory entries), so the sandbox finds a read-only
mountpoint there and can neither create nor replace it: ``rename`` and
``unlink`` of a mountpoint fail with ``EBUSY``. Every ancestor between the
workspace root and the protected path is bound read-write onto itself for
the same reason: otherwise ``mv .git .git.old && mkdir -p .git/hooks``
would plant a hook beside the protected directory. An ancestor that is not
a directory (a git worktree's ``.git`` file) is bound read-only instead,
which blocks everything beneath it.

Symlinks anywhere on the way are refused: bubblewrap resolves a bind
source on the host, so ``.git/hooks -> /root/.ssh`` would otherwise mount a
host directory into the sandbox.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable

from corral import OperationError

from ._policy import ProtectedPath

__all__ = ["protected_mounts"]


def _deny(rel: str, why: str) -> OperationError:
    return OperationError(
        f"protected path {rel} {why}; remove it from the workspace to run commands",
        code="policy_denied",
    )


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _create(path: str, is_dir: bool) -> None:
    try:
        if is_dir:
            os.mkdir(path, 0o755)
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
    except FileExistsError:
        pass  # a concurrent command made it; the lstat that follows decides


def protected_mounts(
    host_root: str, sandbox_root: str, protected: Iterable[ProtectedPath]
) -> list[str]:
    """The bwrap arguments protecting ``protected`` inside a workspace bound at ``sandbox_root``.

    Args:
        host_root: Host path of the workspace.
        sandbox_root: Where the workspace is bound inside the sandbox.
        protected: The protected paths.

    Returns:
        ``--bind``/``--ro-bind`` arguments, shallowest first.

    Raises:
        OperationError: ``policy_denied`` when a protected path or one of its
            ancestors is a symlink or cannot be prepared.
    """
    mounts: dict[str, bool] = {}  # relative path -> read-only
    for entry in protected:
        parts = entry.path.split("/")
        for depth in range(1, len(parts) + 1):
            rel = "/".join(parts[:depth])
            host = os.path.join(host_root, rel)
            leaf = depth == len(parts)
            try:
                st = _lstat(host)
                if st is None:
                    _create(host, entry.is_dir or not leaf)
                    st = _lstat(host)
            except OSError as exc:
                if exc.errno == errno.ENOTDIR:
                    break
                raise _deny(entry.path, "cannot be prepared") from None
            if st is None or stat.S_ISLNK(st.st_mode):
                raise _deny(entry.path, "is or lies under a symlink")
            if leaf or not stat.S_ISDIR(st.st_mode):
                mounts[rel] = True
                break
            mounts.setdefault(rel, False)
    args: list[str] = []
    for rel in sorted(mounts, key=lambda r: (r.count("/"), r)):
        host = os.path.join(host_root, rel)
        inside = f"{sandbox_root}/{rel}"
        args += ["--ro-bind" if mounts[rel] else "--bind", host, inside]
    return args
