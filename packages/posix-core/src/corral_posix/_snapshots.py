"""Snapshots of a tmpdir workspace as gzip tarballs beside it.

Each snapshot is ``<id>.tar.gz`` plus ``<id>.json`` (id, time, label,
skipped entries) in the workspace's snapshot area (see
:class:`~corral_posix.TmpdirLayout`). The tarball is renamed into place
before its metadata, and listing only reports snapshots whose metadata
exists, so a crash mid-snapshot leaves no half snapshot behind.

``restore`` extracts into a new directory beside the workspace and swaps it
in with ``renameat2(RENAME_EXCHANGE)`` where the kernel offers it (one
atomic step: the workspace path never stops existing), falling back to two
renames; the old tree is then removed and the filesystem module reattached
to the new root. Files the caller still holds open keep their old content.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import anyio
import anyio.to_thread

from corral import (
    OperationError,
    SnapshotInfo,
    WorkspaceEvictedError,
    WorkspaceFailedError,
    WorkspaceRef,
    ensure_open,
)

from ._layout import TmpdirLayout, TmpdirRefPayload, remove_tree
from ._tarball import extract_tree, write_tree

__all__ = ["MAX_LABEL_LENGTH", "Reattachable", "TmpdirSnapshotter", "exchange_dirs"]

log = logging.getLogger("corral.posix.snapshots")

MAX_LABEL_LENGTH: Final = 200
_ID_RE: Final = re.compile(r"snap-[0-9a-f]{16}-[0-9a-f]{8}")
_RENAME_EXCHANGE: Final = 2
_AT_FDCWD: Final = -100


class Reattachable(Protocol):
    """A filesystem module that can reopen its root after the directory was swapped."""

    def reattach(self) -> None:
        """Reopen the root directory fd."""
        ...


def _renameat2() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return getattr(libc, "renameat2", None)
    except OSError:
        return None


def exchange_dirs(a: str, b: str) -> bool:
    """Atomically swap two paths with ``renameat2(RENAME_EXCHANGE)``.

    Returns:
        False when the platform or filesystem cannot do it (nothing was changed).

    Raises:
        OSError: The exchange was attempted and failed for another reason.
    """
    fn = _renameat2()
    if fn is None:
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err))


def _check_id(snapshot_id: object) -> str:
    if not isinstance(snapshot_id, str) or not _ID_RE.fullmatch(snapshot_id):
        raise OperationError("no snapshot with that id", code="not_found")
    return snapshot_id


class TmpdirSnapshotter:
    """:class:`corral.Snapshotter` over a :class:`~corral_posix.TmpdirLayout` workspace.

    Shared by local-bash, local-sandbox and docker: everything
    provider-specific comes in through ``layout`` and ``make_ref``.

    Args:
        layout: The provider's layout.
        workspace: Name of the workspace directory under the layout's base.
        make_ref: Builds the ref of a workspace name (``restore`` returns
            ``make_ref(workspace)``; ``branch`` returns it for the new one).
        fs: The workspace's filesystem module, reattached after a restore.
        compresslevel: gzip level; 1 favours speed, snapshots are frequent.
        after_extract: Called (blocking, in a worker thread) with the root
            and state directory of a workspace whose content a restore or
            branch just wrote, before anything uses it: a snapshot may hold
            what the isolation must never trust (see ``Isolation.after_extract``).
    """

    def __init__(
        self,
        layout: TmpdirLayout,
        workspace: str,
        make_ref: Callable[[str], WorkspaceRef],
        *,
        fs: Reattachable | None = None,
        compresslevel: int = 1,
        after_extract: Callable[[str, str], object] | None = None,
    ) -> None:
        if not 1 <= compresslevel <= 9:
            raise ValueError("compresslevel must be between 1 and 9")
        self._layout = layout
        self._name = workspace
        self._make_ref = make_ref
        self._fs = fs
        self._after_extract = after_extract
        self._level = compresslevel
        self._lock = anyio.Lock()
        self._closed = False

    def close(self) -> None:
        """Refuse further calls (the workspace is closing)."""
        self._closed = True

    @property
    def _dir(self) -> str:
        return self._layout.snapshot_path(self._name)

    def _live_path(self) -> str:
        payload = TmpdirRefPayload(
            workspace=self._name, base_dir=self._layout.base_dir, max_file_bytes=0
        )
        try:
            return self._layout.locate(payload)
        except WorkspaceFailedError:
            raise WorkspaceEvictedError(
                f"{self._layout.provider_id}: the workspace directory is gone",
                provider_id=self._layout.provider_id,
            ) from None

    # -- snapshot ------------------------------------------------------------

    def _snapshot_sync(self, label: str | None) -> SnapshotInfo:
        root = self._live_path()
        snap_id = f"snap-{time.time_ns():016x}-{secrets.token_hex(4)}"
        created = time.time()
        final = os.path.join(self._dir, f"{snap_id}.tar.gz")
        tmp = os.path.join(self._dir, f".tmp-{snap_id}.tar.gz")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            raise WorkspaceEvictedError(
                f"{self._layout.provider_id}: the snapshot area is gone",
                provider_id=self._layout.provider_id,
            ) from None
        try:
            with os.fdopen(fd, "wb") as out:
                skipped = write_tree(root, out, compresslevel=self._level)
                out.flush()
                os.fsync(out.fileno())
            size = os.stat(tmp).st_size
            os.replace(tmp, final)
            meta = {
                "snapshot_id": snap_id,
                "created_at": created,
                "label": label,
                "skipped": skipped[:100],
            }
            meta_tmp = os.path.join(self._dir, f".tmp-{snap_id}.json")
            with open(meta_tmp, "x", encoding="utf-8") as f:
                json.dump(meta, f)
            os.replace(meta_tmp, os.path.join(self._dir, f"{snap_id}.json"))
        except BaseException:
            for path in (tmp, final):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise
        return SnapshotInfo(snapshot_id=snap_id, created_at=created, label=label, size_bytes=size)

    async def snapshot(self, label: str | None = None) -> SnapshotInfo:
        """Store the workspace's current files, directories, modes and symlinks.

        FIFOs, sockets and device nodes are skipped and logged.

        Raises:
            OperationError: Bad label, or the tree is too deep.
            WorkspaceEvictedError: The workspace directory is gone.
        """
        ensure_open(self._closed)
        if label is not None and (not isinstance(label, str) or len(label) > MAX_LABEL_LENGTH):
            raise OperationError(
                f"label must be a string of at most {MAX_LABEL_LENGTH} characters",
                code="invalid_argument",
            )
        async with self._lock:
            return await anyio.to_thread.run_sync(self._snapshot_sync, label)

    # -- list / delete -------------------------------------------------------

    def _read_meta(self, name: str) -> SnapshotInfo | None:
        snap_id = name[: -len(".json")]
        try:
            with open(os.path.join(self._dir, name), encoding="utf-8") as f:
                meta = json.load(f)
            size = os.stat(os.path.join(self._dir, f"{snap_id}.tar.gz")).st_size
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict):
            return None
        created, label = meta.get("created_at"), meta.get("label")
        if (
            meta.get("snapshot_id") != snap_id
            or not isinstance(created, int | float)
            or not (label is None or isinstance(label, str))
        ):
            log.warning("snapshot: ignoring malformed metadata %s", name)
            return None
        return SnapshotInfo(
            snapshot_id=snap_id, created_at=float(created), label=label, size_bytes=size
        )

    def _list_sync(self) -> list[SnapshotInfo]:
        try:
            names = os.listdir(self._dir)
        except FileNotFoundError:
            return []
        infos = [
            info
            for name in names
            if name.endswith(".json") and _ID_RE.fullmatch(name[:-5])
            if (info := self._read_meta(name)) is not None
        ]
        return sorted(infos, key=lambda i: (i.created_at, i.snapshot_id))

    async def list(self) -> Sequence[SnapshotInfo]:
        """This workspace's snapshots, oldest first."""
        ensure_open(self._closed)
        return await anyio.to_thread.run_sync(self._list_sync)

    def _tar_path(self, snapshot_id: str) -> str:
        path = os.path.join(self._dir, f"{_check_id(snapshot_id)}.tar.gz")
        if not os.path.isfile(os.path.join(self._dir, f"{snapshot_id}.json")) or not (
            os.path.isfile(path)
        ):
            raise OperationError("no snapshot with that id", code="not_found")
        return path

    def _delete_sync(self, snapshot_id: str) -> None:
        self._tar_path(snapshot_id)
        # Metadata first: from then on the snapshot is invisible to list().
        os.unlink(os.path.join(self._dir, f"{snapshot_id}.json"))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self._dir, f"{snapshot_id}.tar.gz"))

    async def delete(self, snapshot_id: str) -> None:
        """Remove a snapshot.

        Raises:
            OperationError: ``not_found`` for an unknown id.
        """
        ensure_open(self._closed)
        async with self._lock:
            await anyio.to_thread.run_sync(self._delete_sync, snapshot_id)

    # -- restore / branch ----------------------------------------------------

    def _restore_sync(self, snapshot_id: str) -> None:
        tar_path = self._tar_path(snapshot_id)
        live = self._live_path()
        staging = self._layout.new_temp_dir("tmp")
        trash = ""
        try:
            extract_tree(tar_path, staging)
            if not exchange_dirs(staging, live):
                # Not atomic: for an instant the workspace path does not exist.
                trash = self._layout.new_temp_dir("trash")
                os.rename(live, os.path.join(trash, "old"))
                try:
                    os.rename(staging, live)
                except OSError:
                    os.rename(os.path.join(trash, "old"), live)
                    raise
        finally:
            remove_tree(staging)
            if trash:
                remove_tree(trash)
        if self._fs is not None:
            self._fs.reattach()
        if self._after_extract is not None:
            self._after_extract(live, self._layout.state_path(self._name))

    async def restore(self, snapshot_id: str) -> WorkspaceRef:
        """Replace the workspace's content with the snapshot's, exactly.

        Returns:
            The same ref as before: the workspace keeps its directory and name.

        Raises:
            OperationError: Unknown id, or a damaged or unsafe tarball (the
                workspace is then left untouched).
            WorkspaceEvictedError: The workspace directory is gone.
        """
        ensure_open(self._closed)
        async with self._lock:
            await anyio.to_thread.run_sync(self._restore_sync, snapshot_id)
        return self._make_ref(self._name)

    def _branch_sync(self, snapshot_id: str) -> str:
        tar_path = self._tar_path(snapshot_id)
        session_part = self._name[len("ws-") : -len("-xxxxxxxx")]
        new_name = self._layout.create_workspace(session_part)
        try:
            extract_tree(tar_path, self._layout.workspace_path(new_name))
            if self._after_extract is not None:
                self._after_extract(
                    self._layout.workspace_path(new_name), self._layout.state_path(new_name)
                )
        except BaseException:
            self._layout.remove_workspace(new_name)
            raise
        return new_name

    async def branch(self, snapshot_id: str) -> WorkspaceRef:
        """Create a separate workspace seeded from a snapshot, with no snapshots of its own.

        Returns:
            The new workspace's ref; resolve it to use it. This workspace is unchanged.

        Raises:
            OperationError: Unknown id or damaged tarball.
        """
        ensure_open(self._closed)
        new_name = await anyio.to_thread.run_sync(self._branch_sync, snapshot_id)
        return self._make_ref(new_name)
