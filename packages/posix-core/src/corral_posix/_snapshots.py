"""Snapshots of a tmpdir workspace as versions in a content-addressed store.

A version is a manifest (``<id>.manifest``, see :mod:`._manifest`) plus its
metadata (``<id>.json``: id, time, label, the manifest's SHA-256), both in
the workspace's snapshot area outside the workspace; file contents are
blobs in a store every workspace under the same base shares
(``<base>/store``, see :mod:`._blobstore`), so branches share it too.

* ``snapshot`` reads only files whose ``(dev, ino, size, mtime_ns,
  ctime_ns)`` changed since the previous version; blobs are flushed with one
  ``syncfs`` and the metadata is renamed in last, so a crash mid-snapshot
  leaves the previous versions exactly as they were.
* ``restore`` brings the tree to the version by difference, in place (the
  root is never swapped, so a live bind mount keeps working), behind a
  journal in the state area: a crash mid-restore is finished by
  :meth:`TmpdirSnapshotter.recover` at the next resolve or use.
* ``branch`` materialises a version into a new workspace (reflinks where
  the filesystem has them).
* ``read_file_at``/``ls_at``/``stat_at``/``grep_at``/``diff`` read versions
  straight from the store, verifying every blob.
* Tarball snapshots of the previous schema version are converted into
  versions once, on first use.

Locks: a per-workspace ``flock`` serialises snapshot, restore and delete
across processes; the store's lock is held shared while blobs are written
and exclusively by garbage collection.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import stat
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Final, Protocol

import anyio
import anyio.to_thread
import attrs

from corral.provider import (
    BINARY_SNIFF_BYTES,
    FileEntry,
    FileStat,
    GrepMatch,
    GrepOptions,
    GrepResult,
    Matcher,
    OperationError,
    ProgressCallback,
    ProgressReporter,
    SnapshotInfo,
    VersionChange,
    WorkspaceEvictedError,
    WorkspaceFailedError,
    WorkspaceRef,
    bytes_searcher,
    current_progress_callback,
    glob_match,
    is_binary,
    join_path,
    path_parts,
    workspace_closed,
)

from ._blobstore import BLOB_NAME, BlobError, LocalBlobStore, syncfs
from ._changes import ChangeJournal, Changes
from ._fileops import where
from ._layout import TmpdirLayout, TmpdirRefPayload, remove_tree
from ._manifest import (
    Manifest,
    ManifestError,
    decode,
    diff,
    operation_error,
    referenced_blobs,
)
from ._tarball import extract_tree
from ._versions import Caps, Stale, Watch, apply, apply_changes, scan, scan_changes

__all__ = ["MAX_LABEL_LENGTH", "Reattachable", "TmpdirSnapshotter", "exchange_dirs", "store_path"]

log = logging.getLogger("corral.posix.snapshots")

MAX_LABEL_LENGTH: Final = 200
_ID_RE: Final = re.compile(r"snap-[0-9a-f]{16}-[0-9a-f]{8}")
_RENAME_EXCHANGE: Final = 2
_AT_FDCWD: Final = -100
_STORE: Final = "store"
_LOCK: Final = "versions.lock"
_JOURNAL: Final = "restore.journal"
_CACHE: Final = 4
_RACED: Final = frozenset(
    {errno.EEXIST, errno.EISDIR, errno.ENOTDIR, errno.ENOTEMPTY, errno.ENOENT, errno.ELOOP}
)
_CHANGED_WHILE_RESTORING: Final = "the workspace changed while it was being restored; try again"
_MANIFEST_BYTES_PER_ENTRY: Final = 4400
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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


@contextlib.contextmanager
def _flock(path: str, kind: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, kind)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _read_small(path: str, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            raise ManifestError("the version's metadata is damaged or unsafe (size)")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _apply_progress(
    operation: str, target: Manifest, callback: ProgressCallback | None
) -> ProgressReporter | None:
    """A reporter of an apply walk over ``target`` (every entry below the root), if watched."""
    if callback is None:
        return None
    return ProgressReporter(operation, unit="entries", total=len(target) - 1, callback=callback)


@attrs.frozen
class _Meta:
    info: SnapshotInfo
    manifest_sha256: str | None  # None: a tarball of the previous schema version
    scan_ns: int


def store_path(layout: TmpdirLayout) -> str:
    """The blob store every workspace (and branch) under a layout's base shares."""
    return os.path.join(layout.base_dir, _STORE)


class TmpdirSnapshotter:
    """:class:`corral.provider.Versions` over a :class:`~corral_posix.TmpdirLayout` workspace.

    Shared by local-bash, local-sandbox and docker: everything
    provider-specific comes in through ``layout`` and ``make_ref``.

    Args:
        layout: The provider's layout.
        workspace: Name of the workspace directory under the layout's base.
        make_ref: Builds the ref of a workspace name (``restore`` returns
            ``make_ref(workspace)``; ``branch`` returns it for the new one).
        fs: The workspace's filesystem module (kept for callers of the
            tarball era; restore by difference never swaps the root, so it
            no longer needs reattaching).
        compresslevel: Accepted for compatibility; versions are stored
            uncompressed so that branches can reflink them.
        after_extract: Called (blocking, in a worker thread) with the root
            and state directory of a workspace whose content a restore or
            branch just wrote, before anything uses it: a snapshot may hold
            what the isolation must never trust (see ``Isolation.after_extract``).
        caps: Entry and byte caps of one version.
        max_file_bytes: Default cap of ``read_file_at``.
        owner: ``(uid, gid)`` that what a restore or branch creates is
            given to (docker's container user when the host is root), so
            the workspace's user keeps owning its tree; None keeps the
            writer's.
        tree_writers: Returns the pids of every process that may hold a
            file of the tree open, or None when that is unknown. Given, the
            snapshotter keeps a change journal (:mod:`corral_posix._changes`)
            and later snapshots and restores read only what changed. Offer
            it only where no process can write the tree through a name
            outside it (a hard link from another mount), as a sandbox
            guarantees; None walks the whole tree every time.
        after_patch: Called instead of ``after_extract`` after a restore
            the change journal drove, with ``(root, state_dir, names)``:
            the names of the entries it wrote, created, removed or
            re-moded (everything else is as it was before the restore), and
            after a branch with the names of every entry it created.
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
        caps: Caps | None = None,
        max_file_bytes: int = 100 * 1024 * 1024,
        owner: tuple[int, int] | None = None,
        tree_writers: Callable[[], Iterable[int] | None] | None = None,
        after_patch: Callable[[str, str, AbstractSet[str]], object] | None = None,
    ) -> None:
        if not 1 <= compresslevel <= 9:
            raise ValueError("compresslevel must be between 1 and 9")
        self._layout = layout
        self._name = workspace
        self._make_ref = make_ref
        self._fs = fs
        self._after_extract = after_extract
        self._caps = caps or Caps()
        self._max_file_bytes = max_file_bytes
        self._owner = owner
        self._lock = anyio.Lock()
        self._closed = False
        self._index: tuple[Manifest, int] | None = None
        self._index_id = ""
        self._cache: OrderedDict[str, tuple[Manifest, float]] = OrderedDict()
        self._blobs: LocalBlobStore | None = None
        self._after_patch = after_patch
        self._changes = ChangeJournal(tree_writers) if tree_writers is not None else None
        # The manifest the live tree equalled when the journal last committed,
        # and the version that holds it (whose blobs its content names).
        self._base: tuple[Manifest, str] | None = None

    def close(self) -> None:
        """Refuse further calls (the workspace is closing)."""
        self._closed = True
        self._forget_base()
        if self._blobs is not None:
            self._blobs.close()

    def _forget_base(self) -> None:
        self._base = None
        if self._changes is not None:
            self._changes.invalidate()

    def _check_open(self) -> None:
        if self._closed:
            raise workspace_closed()

    @property
    def _dir(self) -> str:
        return self._layout.snapshot_path(self._name)

    @property
    def _state(self) -> str:
        return self._layout.state_path(self._name)

    def _store(self) -> LocalBlobStore:
        if self._blobs is None:
            self._layout.check_base()
            self._blobs = LocalBlobStore(store_path(self._layout))
        return self._blobs

    def _store_lock(self, kind: int) -> contextlib.AbstractContextManager[None]:
        return _flock(os.path.join(self._store().root, "lock"), kind)

    def _ws_lock(self) -> contextlib.AbstractContextManager[None]:
        try:
            return _flock(os.path.join(self._state, _LOCK), fcntl.LOCK_EX)
        except FileNotFoundError:
            raise self._evicted("the snapshot area is gone") from None

    def _evicted(self, why: str) -> WorkspaceEvictedError:
        return WorkspaceEvictedError(
            f"{self._layout.provider_id}: {why}", provider_id=self._layout.provider_id
        )

    def _live_path(self) -> str:
        # locate() reads only the name and base; the payload's byte cap must be positive.
        payload = TmpdirRefPayload(
            workspace=self._name, base_dir=self._layout.base_dir, max_file_bytes=1
        )
        try:
            return self._layout.locate(payload)
        except WorkspaceFailedError:
            raise self._evicted("the workspace directory is gone") from None

    @contextlib.contextmanager
    def _root_fd(self) -> Iterator[int]:
        fd = os.open(self._live_path(), _DIR_FLAGS)
        try:
            yield fd
        finally:
            os.close(fd)

    # -- metadata and manifests ----------------------------------------------

    def _read_meta(self, snap_id: str) -> _Meta | None:
        try:
            meta = json.loads(_read_small(os.path.join(self._dir, f"{snap_id}.json"), 1 << 20))
        except (OSError, ValueError, ManifestError):
            return None
        if not isinstance(meta, dict):
            return None
        created, label = meta.get("created_at"), meta.get("label")
        digest, size, scan_ns = (
            meta.get("manifest_sha256"),
            meta.get("size_bytes"),
            meta.get("scan_ns", 0),
        )
        if (
            meta.get("snapshot_id") != snap_id
            or not isinstance(created, int | float)
            or not (label is None or isinstance(label, str))
            or not (digest is None or (isinstance(digest, str) and BLOB_NAME.fullmatch(digest)))
            or not isinstance(scan_ns, int)
        ):
            log.warning("snapshot: ignoring malformed metadata of %s", snap_id)
            return None
        if digest is None:
            try:
                size = os.stat(os.path.join(self._dir, f"{snap_id}.tar.gz")).st_size
            except OSError:
                return None
        info = SnapshotInfo(
            snapshot_id=snap_id,
            created_at=float(created),
            label=label,
            size_bytes=size if isinstance(size, int) else None,
        )
        return _Meta(info, digest, scan_ns)

    def _metas(self) -> list[_Meta]:
        try:
            names = os.listdir(self._dir)
        except FileNotFoundError:
            return []
        metas = [
            m
            for name in names
            if name.endswith(".json") and _ID_RE.fullmatch(name[:-5])
            if (m := self._read_meta(name[:-5])) is not None
        ]
        return sorted(metas, key=lambda m: (m.info.created_at, m.info.snapshot_id))

    def _meta(self, snapshot_id: str) -> _Meta:
        meta = self._read_meta(_check_id(snapshot_id))
        if meta is None:
            raise OperationError("no snapshot with that id", code="not_found")
        return meta

    def _manifest(self, snapshot_id: str) -> tuple[Manifest, _Meta]:
        """The validated manifest of a version (converting a tarball of N-1 once)."""
        meta = self._meta(snapshot_id)
        if meta.manifest_sha256 is None:
            meta = self._convert(meta)
        cached = self._cache.get(snapshot_id)
        if cached is not None:
            self._cache.move_to_end(snapshot_id)
            return cached[0], meta
        try:
            raw = _read_small(
                os.path.join(self._dir, f"{snapshot_id}.manifest"),
                _MANIFEST_BYTES_PER_ENTRY * self._caps.max_entries,
            )
        except FileNotFoundError:
            raise OperationError(
                f"version {snapshot_id}: its manifest is missing", code="failed"
            ) from None
        except ManifestError as exc:
            raise operation_error(exc) from None
        if hashlib.sha256(raw).hexdigest() != meta.manifest_sha256:
            raise OperationError(f"version {snapshot_id}: its manifest is corrupt", code="failed")
        try:
            manifest = decode(
                raw, max_entries=self._caps.max_entries, max_bytes=self._caps.max_bytes
            )
        except ManifestError as exc:
            raise operation_error(exc) from None
        self._cache[snapshot_id] = (manifest, meta.info.created_at)
        while len(self._cache) > _CACHE:
            self._cache.popitem(last=False)
        return manifest, meta

    def _commit(
        self, snap_id: str, manifest: Manifest, info: SnapshotInfo, scan_ns: int, skipped: list[str]
    ) -> str:
        raw = manifest.encode()
        digest = hashlib.sha256(raw).hexdigest()
        _write_atomic(os.path.join(self._dir, f"{snap_id}.manifest"), raw)
        meta = {
            "format": 2,
            "snapshot_id": snap_id,
            "created_at": info.created_at,
            "label": info.label,
            "size_bytes": info.size_bytes,
            "manifest_sha256": digest,
            "scan_ns": scan_ns,
            "skipped": skipped[:100],
        }
        # The metadata is the commit point: until it is renamed in, list()
        # does not see the version and the previous ones are untouched.
        _write_atomic(os.path.join(self._dir, f"{snap_id}.json"), json.dumps(meta).encode())
        return digest

    def _convert(self, meta: _Meta) -> _Meta:
        """Turn a tarball snapshot of the previous schema into a version, once."""
        snap_id = meta.info.snapshot_id
        tar_path = os.path.join(self._dir, f"{snap_id}.tar.gz")
        staging = self._layout.new_temp_dir("tmp")
        try:
            extract_tree(tar_path, staging)
            fd = os.open(staging, _DIR_FLAGS)
            try:
                with self._store_lock(fcntl.LOCK_SH):
                    manifest, skipped = scan(fd, None, self._store(), self._caps, time.time_ns())
                    # Keys of the staging tree would describe files that are gone.
                    manifest.key = [None] * len(manifest)
                    self._store().sync()
                    info = attrs.evolve(meta.info, size_bytes=manifest.file_bytes)
                    digest = self._commit(snap_id, manifest, info, 0, skipped)
            finally:
                os.close(fd)
        finally:
            remove_tree(staging)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tar_path)
        log.info("snapshot: converted %s from a tarball to a version", snap_id)
        return _Meta(info, digest, 0)

    def _latest_index(self, *, recheck: bool = False) -> tuple[Manifest, int] | None:
        """The manifest of this tree that scans trust keys from (newest version).

        Args:
            recheck: Drop the cached one if another process deleted its
                version meanwhile (a scan takes over content by hash from
                it, and those blobs may be collected): call under the
                store's lock.
        """
        if (
            recheck
            and self._index is not None
            and not os.path.exists(os.path.join(self._dir, f"{self._index_id}.json"))
        ):
            self._index = None
        if self._index is None:
            for meta in reversed(self._metas()):
                if meta.manifest_sha256 is None:
                    continue
                try:
                    self._index = (self._manifest(meta.info.snapshot_id)[0], meta.scan_ns)
                except OperationError:
                    continue
                self._index_id = meta.info.snapshot_id
                break
        return self._index

    # -- snapshot ------------------------------------------------------------

    def _scan_live(
        self,
        prev: Manifest | None,
        blobs: LocalBlobStore | None,
        scan_ns: int,
        progress: ProgressReporter | None,
    ) -> tuple[Manifest, builtins.list[str]]:
        """The live tree's manifest (new content stored in ``blobs`` unless None).

        The one place the live tree is read for a snapshot or a diff: a
        subclass whose tree is not a host directory (a remote engine's
        volume) overrides it.
        """
        with self._root_fd() as root_fd:
            return scan(root_fd, prev, blobs, self._caps, scan_ns, progress=progress)

    def _base_changes(self) -> tuple[Manifest, Changes] | None:
        """The journal's base and what changed since, when both can be trusted now.

        Runs under the store's shared lock: the base's version must still
        exist (its blobs are what the base's unchanged entries name, and
        a collection cannot run while the lock is held).
        """
        journal, base = self._changes, self._base
        if journal is None or base is None:
            return None
        if not os.path.exists(os.path.join(self._dir, f"{base[1]}.json")):
            self._forget_base()
            return None
        changes = journal.changes()
        return None if changes is None else (base[0], changes)

    def _scan_tracked(
        self,
        prev: Manifest | None,
        blobs: LocalBlobStore,
        scan_ns: int,
        progress: ProgressReporter | None,
    ) -> tuple[Manifest, builtins.list[str]]:
        """:meth:`_scan_live` for a snapshot, through the change journal where there is one."""
        journal = self._changes
        if journal is None:
            return self._scan_live(prev, blobs, scan_ns, progress)
        with self._root_fd() as root_fd:
            try:
                found = self._base_changes()
                if found is not None:
                    try:
                        out = scan_changes(
                            root_fd,
                            found[0],
                            found[1],
                            blobs=blobs,
                            caps=self._caps,
                            scan_ns=scan_ns,
                            watch=Watch(journal.watch),
                            progress=progress,
                        )
                    except Stale:
                        log.info("snapshot: the change journal is stale; walking the whole tree")
                    else:
                        self._base = (out[0], "")  # named once the version commits
                        return out
                # A whole walk, which starts a new journal as it goes.
                watch = Watch(journal.watch) if journal.start(root_fd) else None
                out = scan(
                    root_fd, prev, blobs, self._caps, scan_ns, progress=progress, watch=watch
                )
            except BaseException:
                self._forget_base()
                raise
        if watch is None or watch.links or not journal.valid:
            self._forget_base()
        else:
            self._base = (out[0], "")  # named once the version commits
        return out

    def _snapshot_sync(
        self, label: str | None, on_progress: ProgressCallback | None
    ) -> SnapshotInfo:
        progress = (
            ProgressReporter("snapshot", unit="entries", callback=on_progress)
            if on_progress is not None
            else None
        )
        with self._ws_lock():
            self._recover_locked()
            snap_id = f"snap-{time.time_ns():016x}-{secrets.token_hex(4)}"
            created = time.time()
            scan_ns = time.time_ns()
            blobs = self._store()
            with self._store_lock(fcntl.LOCK_SH):
                # Under the lock: the versions whose blobs a scan takes over
                # cannot be collected until the new version commits.
                index = self._latest_index(recheck=True)
                prev = index[0] if index is not None else None
                manifest, skipped = self._scan_tracked(prev, blobs, scan_ns, progress)
                blobs.sync()
                info = SnapshotInfo(
                    snapshot_id=snap_id,
                    created_at=created,
                    label=label,
                    size_bytes=manifest.file_bytes,
                )
                if not os.path.isdir(self._dir):
                    raise self._evicted("the snapshot area is gone")
                self._commit(snap_id, manifest, info, scan_ns, skipped)
            if self._base is not None and self._base[0] is manifest:
                self._base = (manifest, snap_id)
            self._index = (manifest, scan_ns)
            self._index_id = snap_id
            self._cache[snap_id] = (manifest, created)
            while len(self._cache) > _CACHE:
                self._cache.popitem(last=False)
        if progress is not None:
            progress.finish()
        return info

    async def snapshot(
        self, label: str | None = None, *, on_progress: ProgressCallback | None = None
    ) -> SnapshotInfo:
        """Store a new version: only files changed since the last one are read.

        FIFOs, sockets and device nodes are skipped and logged.

        Args:
            label: A note to recognise the version by.
            on_progress: Receives ``snapshot`` progress in ``entries`` walked
                (default: the caller's :func:`corral.reporting_progress`).
                The total is None while walking — a tree's size is unknown
                until walked, and a previous version's count would be an
                estimate the walk can overrun — and the final report has
                ``done == total`` (the entries walked).

        Raises:
            OperationError: Bad label, or the tree is over a cap.
            WorkspaceEvictedError: The workspace directory is gone.
        """
        if self._closed:
            raise workspace_closed()
        if label is not None and (not isinstance(label, str) or len(label) > MAX_LABEL_LENGTH):
            raise OperationError(
                f"label must be a string of at most {MAX_LABEL_LENGTH} characters",
                code="invalid_argument",
            )
        callback = on_progress if on_progress is not None else current_progress_callback()
        async with self._lock:
            return await anyio.to_thread.run_sync(self._snapshot_sync, label, callback)

    # -- list / delete -------------------------------------------------------

    async def list(self) -> Sequence[SnapshotInfo]:
        """This workspace's snapshots, oldest first."""
        if self._closed:
            raise workspace_closed()
        metas = await anyio.to_thread.run_sync(self._metas)
        return [m.info for m in metas]

    def _delete_sync(self, snapshot_id: str) -> None:
        with self._ws_lock():
            self._meta(snapshot_id)
            # Metadata first: from then on the version is invisible to list().
            os.unlink(os.path.join(self._dir, f"{snapshot_id}.json"))
            for suffix in (".manifest", ".tar.gz"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self._dir, f"{snapshot_id}{suffix}"))
            self._cache.pop(snapshot_id, None)
            self._index = None
        self.collect_garbage()

    def collect_garbage(self) -> int:
        """Remove blobs no version under this base refers to; return how many (blocking).

        Mark and sweep under the store's exclusive lock (snapshots in flight
        hold it shared, so their new blobs are never swept before their
        manifest commits). Manifests without committed metadata are crash
        leftovers and are removed too.
        """
        blobs = self._store()
        state_root = os.path.dirname(self._state)
        with self._store_lock(fcntl.LOCK_EX):
            keep: set[str] = set()
            for ws in os.listdir(state_root):
                snaps = os.path.join(state_root, ws, "snapshots")
                try:
                    names = os.listdir(snaps)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                for name in names:
                    if not name.endswith(".manifest"):
                        continue
                    path = os.path.join(snaps, name)
                    if not os.path.exists(path[: -len(".manifest")] + ".json"):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(path)
                        continue
                    with open(path, "rb") as f:
                        keep.update(referenced_blobs(f.read()))
            removed = 0
            for digest in list(blobs.names()):
                if digest not in keep:
                    blobs.delete(digest)
                    removed += 1
            blobs.sweep_tmp()
        return removed

    async def delete(self, snapshot_id: str) -> None:
        """Remove a version and garbage-collect the blobs no version uses any more.

        Raises:
            OperationError: ``not_found`` for an unknown id.
        """
        if self._closed:
            raise workspace_closed()
        async with self._lock:
            await anyio.to_thread.run_sync(self._delete_sync, snapshot_id)

    # -- restore / branch ----------------------------------------------------

    def _journal(self) -> str:
        return os.path.join(self._state, _JOURNAL)

    def _apply_locked(
        self, snapshot_id: str, target: Manifest, progress: ProgressReporter | None = None
    ) -> None:
        live = self._live_path()
        index = self._latest_index()
        _write_atomic(self._journal(), snapshot_id.encode())
        written: builtins.set[str] | None = None
        with self._root_fd() as root_fd:
            try:
                written = self._apply_tracked(root_fd, snapshot_id, target, progress)
                if written is None:
                    apply(
                        root_fd,
                        target,
                        index[0] if index else None,
                        self._store(),
                        snapshot_id,
                        owner=self._owner,
                        progress=progress,
                    )
            except BaseException as exc:
                self._forget_base()
                stopped = exc
                if isinstance(exc, OSError) and exc.errno in _RACED:
                    # A command changed the type or presence of an entry between
                    # the walk's look and its act (a rename exchange from inside).
                    stopped = OperationError(_CHANGED_WHILE_RESTORING, code="failed")
                if not isinstance(stopped, OperationError):
                    raise
                # Not a crash: the walk stopped on purpose (damaged content, a
                # tree changing under it). The journal exists to finish a crashed
                # restore; left behind, it would replay this failure before every
                # later snapshot or restore and lock the workspace up.
                os.unlink(self._journal())
                raise OperationError(
                    f"{stopped}; the restore stopped there "
                    "(entries before it may already be restored)",
                    code=stopped.code,
                ) from None
            syncfs(root_fd)
        os.unlink(self._journal())
        if self._changes is not None and self._changes.valid:
            # The tree is the target now, plus whatever the journal sees from now on
            # (events queued during the restore are still to be read).
            if written is None:
                self._changes.settle()
            self._base = (target, snapshot_id)
        if written is not None and self._after_patch is not None:
            self._after_patch(live, self._state, written)
        elif self._after_extract is not None:
            self._after_extract(live, self._state)

    def _apply_tracked(
        self,
        root_fd: int,
        snapshot_id: str,
        target: Manifest,
        progress: ProgressReporter | None,
    ) -> builtins.set[str] | None:
        """A restore driven by the change journal: the names it changed, or None if it cannot."""
        journal = self._changes
        with self._store_lock(fcntl.LOCK_SH):
            found = self._base_changes()
        if journal is None or found is None:
            return None
        try:
            return apply_changes(
                root_fd,
                target,
                found[0],
                found[1],
                blobs=self._store(),
                label=snapshot_id,
                watch=Watch(journal.watch),
                owner=self._owner,
                progress=progress,
            )
        except Stale:
            log.info("restore: the change journal is stale; comparing the whole tree")
            return None

    def _recover_locked(self) -> None:
        try:
            snapshot_id = _read_small(self._journal(), 1024).decode("ascii", "replace")
        except FileNotFoundError:
            return
        except (OSError, ManifestError):
            snapshot_id = ""
        try:
            target, _meta = self._manifest(snapshot_id)
        except OperationError:
            # The version it was restoring is gone or unusable: nothing to finish with.
            log.warning("snapshot: dropping the journal of an unfinishable restore")
            os.unlink(self._journal())
            return
        log.warning("snapshot: finishing a restore that was interrupted")
        try:
            self._apply_locked(snapshot_id, target)
        except OperationError:
            # _apply_locked dropped the journal: the next operation goes ahead.
            log.warning("snapshot: the interrupted restore cannot be finished; left as it is")

    def recover_sync(self) -> None:
        """Finish a restore a crash interrupted (blocking; run it at resolve)."""
        if not os.path.exists(self._journal()):
            return
        with self._ws_lock():
            self._recover_locked()

    async def recover(self) -> None:
        """Finish a restore a crash interrupted, before anything uses the workspace."""
        await anyio.to_thread.run_sync(self.recover_sync)

    def _restore_sync(self, snapshot_id: str, on_progress: ProgressCallback | None) -> None:
        with self._ws_lock():
            self._recover_locked()
            target, _meta = self._manifest(snapshot_id)
            progress = _apply_progress("restore", target, on_progress)
            self._apply_locked(snapshot_id, target, progress)
        if progress is not None:
            progress.finish()

    async def restore(
        self, snapshot_id: str, *, on_progress: ProgressCallback | None = None
    ) -> WorkspaceRef:
        """Make the workspace equal a version, in place, touching only what differs.

        The root directory is never swapped (a live bind mount keeps
        working). A restore interrupted by a crash is finished when the
        workspace is next resolved or used (a journal in the state area).

        Args:
            snapshot_id: The version to bring back.
            on_progress: Receives ``restore`` progress in ``entries`` of the
                version checked (default: the caller's
                :func:`corral.reporting_progress`); the total is the
                version's entry count, reached by the final report.

        Returns:
            The same ref as before.

        Raises:
            OperationError: Unknown id, or damaged stored content (named by
                version and path; nothing damaged is written).
            WorkspaceEvictedError: The workspace directory is gone.
        """
        if self._closed:
            raise workspace_closed()
        callback = on_progress if on_progress is not None else current_progress_callback()
        async with self._lock:
            await anyio.to_thread.run_sync(self._restore_sync, snapshot_id, callback)
        return self._make_ref(self._name)

    def _branch_sync(self, snapshot_id: str, on_progress: ProgressCallback | None) -> str:
        target, _meta = self._manifest(snapshot_id)
        progress = _apply_progress("branch", target, on_progress)
        session_part = self._name[len("ws-") : -len("-xxxxxxxx")]
        new_name = self._layout.create_workspace(session_part)
        try:
            fd = os.open(self._layout.workspace_path(new_name), _DIR_FLAGS)
            try:
                apply(
                    fd,
                    target,
                    None,
                    self._store(),
                    snapshot_id,
                    owner=self._owner,
                    progress=progress,
                    fresh=True,
                )
            finally:
                os.close(fd)
            new_root = self._layout.workspace_path(new_name)
            new_state = self._layout.state_path(new_name)
            if self._after_patch is not None:
                self._after_patch(new_root, new_state, set(target.name))
            elif self._after_extract is not None:
                self._after_extract(new_root, new_state)
        except BaseException:
            self._layout.remove_workspace(new_name)
            raise
        if progress is not None:
            progress.finish()
        return new_name

    async def branch(
        self, snapshot_id: str, *, on_progress: ProgressCallback | None = None
    ) -> WorkspaceRef:
        """Create a separate workspace materialised from a version (reflinks where possible).

        Args:
            snapshot_id: The version to start from.
            on_progress: Receives ``branch`` progress in ``entries`` written,
                as :meth:`restore` does.

        Returns:
            The new workspace's ref; it shares the blob store and has no
            snapshots of its own. This workspace is unchanged.

        Raises:
            OperationError: Unknown id or damaged stored content.
        """
        if self._closed:
            raise workspace_closed()
        callback = on_progress if on_progress is not None else current_progress_callback()
        new_name = await anyio.to_thread.run_sync(self._branch_sync, snapshot_id, callback)
        return self._make_ref(new_name)

    # -- conformance hook ----------------------------------------------------

    def _damage_sync(self, snapshot_id: str, path: str, how: str) -> None:
        manifest, _t, idx, parts = self._at(snapshot_id, path)
        if manifest.kind[idx] != "f":
            raise OperationError(f"{where(parts)} is not a file", code="invalid_argument")
        blob = os.path.join(self._store().root, manifest.data[idx][:2], manifest.data[idx][2:])
        if how == "missing":
            os.unlink(blob)
            return
        os.chmod(blob, 0o600)
        with open(blob, "r+b") as f:
            first = f.read(1)
            f.seek(0)
            f.write(bytes([first[0] ^ 0xFF]) if first else b"\0")
        os.chmod(blob, 0o400)

    async def conformance_damage(self, snapshot_id: str, path: str, how: str) -> None:
        """Damage the stored content of one file of a version (for the integrity rule).

        The hook ``corral-conformance``'s ``snapshot.versions.integrity`` rule
        calls, so it can damage a version without knowing where this store
        keeps it. Never exposed as a tool. The blob may be shared with other
        files and versions of identical content: they are damaged too.

        Args:
            snapshot_id: The version.
            path: A file in it.
            how: ``"corrupt"`` (flip its first byte) or ``"missing"`` (delete it).
        """
        if how not in ("corrupt", "missing"):
            raise ValueError("how must be 'corrupt' or 'missing'")
        await anyio.to_thread.run_sync(self._damage_sync, snapshot_id, path, how)

    # -- reading versions ----------------------------------------------------

    def _at(self, snapshot_id: str, path: str) -> tuple[Manifest, float, int, tuple[str, ...]]:
        parts = path_parts(path)
        manifest, meta = self._manifest(snapshot_id)
        idx = 0
        for depth, part in enumerate(parts):
            kind = manifest.kind[idx]
            if kind == "l":
                raise OperationError(
                    f"{where(parts[:depth])} is a symlink; versions are read without following links",  # noqa: E501
                    code="invalid_path",
                )
            if kind != "d":
                raise OperationError(
                    f"{where(parts)} has a non-directory where a directory is needed",
                    code="not_a_directory",
                )
            nxt = manifest.child(idx, part)
            if nxt is None:
                raise OperationError(
                    f"{where(parts)} does not exist in version {snapshot_id}", code="not_found"
                )
            idx = nxt
        return manifest, meta.info.created_at, idx, parts

    def _blob(
        self, snapshot_id: str, manifest: Manifest, idx: int, path: str, max_bytes: int
    ) -> bytes:
        try:
            return self._store().read_verified(manifest.data[idx], max_bytes)
        except BlobError as exc:
            raise OperationError(
                f"version {snapshot_id}: the stored content of {path} is {exc.reason}",
                code="failed",
            ) from None

    def _read_sync(self, snapshot_id: str, path: str, max_bytes: int | None) -> bytes:
        manifest, _t, idx, parts = self._at(snapshot_id, path)
        kind = manifest.kind[idx]
        if kind == "d":
            raise OperationError(f"{where(parts)} is a directory", code="is_a_directory")
        if kind == "l":
            raise OperationError(
                f"{where(parts)} is a symlink; it is not followed", code="invalid_path"
            )
        cap = self._max_file_bytes if max_bytes is None else max_bytes
        if manifest.size[idx] > cap:
            raise OperationError(
                f"{where(parts)} is {manifest.size[idx]} bytes, over the {cap}-byte limit",
                code="too_large",
            )
        return self._blob(snapshot_id, manifest, idx, where(parts), manifest.size[idx])

    async def read_file_at(
        self, snapshot_id: str, path: str, *, max_bytes: int | None = None
    ) -> bytes:
        """A file's content in a version, verified against its hash."""
        if self._closed:
            raise workspace_closed()
        return await anyio.to_thread.run_sync(self._read_sync, snapshot_id, path, max_bytes)

    def _ls_sync(self, snapshot_id: str, path: str) -> Sequence[FileEntry]:
        manifest, _t, idx, parts = self._at(snapshot_id, path)
        if manifest.kind[idx] != "d":
            raise OperationError(f"{where(parts)} is not a directory", code="not_a_directory")
        return manifest.entries(idx, where(parts))

    async def ls_at(self, snapshot_id: str, path: str = "/") -> Sequence[FileEntry]:
        """A directory's listing in a version."""
        if self._closed:
            raise workspace_closed()
        return await anyio.to_thread.run_sync(self._ls_sync, snapshot_id, path)

    def _stat_sync(self, snapshot_id: str, path: str) -> FileStat:
        manifest, created, idx, parts = self._at(snapshot_id, path)
        return manifest.stat(idx, where(parts), created)

    async def stat_at(self, snapshot_id: str, path: str) -> FileStat:
        """A path's metadata in a version (``mtime`` is the version's time)."""
        if self._closed:
            raise workspace_closed()
        return await anyio.to_thread.run_sync(self._stat_sync, snapshot_id, path)

    def _grep_sync(self, snapshot_id: str, matcher: Matcher, options: GrepOptions) -> GrepResult:
        if (
            isinstance(options.max_results, bool)
            or not isinstance(options.max_results, int)
            or options.max_results < 1
        ):
            raise OperationError("max_results must be a positive integer", code="invalid_argument")
        manifest, _t, idx, parts = self._at(snapshot_id, options.path)
        base = where(parts)
        if manifest.kind[idx] == "f":
            files = [(idx, parts[-1] if parts else "", base)]
        elif manifest.kind[idx] == "d":
            files = [(i, rel, join_path(base, rel)) for i, rel in manifest.walk_files(idx)]
        else:
            files = []
        search = bytes_searcher(matcher)
        matches: builtins.list[GrepMatch] = []
        skipped: builtins.list[str] = []
        binary: builtins.list[str] = []
        limit = options.max_results
        truncated = False
        for i, rel, full in files:
            if options.glob is not None:
                subject = rel if "/" in options.glob else rel.rsplit("/", 1)[-1]
                if not glob_match(options.glob, subject):
                    continue
            if manifest.size[i] > self._max_file_bytes:
                skipped.append(full)
                continue
            data = self._blob(snapshot_id, manifest, i, full, manifest.size[i])
            if is_binary(data[:BINARY_SNIFF_BYTES]):
                binary.append(full)
                continue
            found = search(data, limit - len(matches) + 1)
            for line_number, line in found:
                if len(matches) == limit:
                    truncated = True
                    break
                matches.append(GrepMatch(path=full, line_number=line_number, line=line))
            if truncated:
                break
        return GrepResult(
            matches=tuple(matches),
            skipped_paths=tuple(skipped),
            skipped_binary_paths=tuple(binary),
            truncated=truncated,
        )

    async def grep_at(self, snapshot_id: str, matcher: Matcher, options: GrepOptions) -> GrepResult:
        """Search a version's files line by line."""
        if self._closed:
            raise workspace_closed()
        return await anyio.to_thread.run_sync(self._grep_sync, snapshot_id, matcher, options)

    def _diff_sync(self, a: str, b: str | None) -> Sequence[VersionChange]:
        old, _meta = self._manifest(a)
        if b is not None:
            new, _meta = self._manifest(b)
        else:
            index = self._latest_index()
            prev = index[0] if index is not None else None
            new, _skipped = self._scan_live(prev, None, time.time_ns(), None)
        return diff(old, new)

    async def diff(self, a: str, b: str | None = None) -> Sequence[VersionChange]:
        """Entries that differ from version ``a`` to version ``b`` (or to the live tree)."""
        if self._closed:
            raise workspace_closed()
        return await anyio.to_thread.run_sync(self._diff_sync, a, b)
