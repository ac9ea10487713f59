"""Versions of a workspace on a remote engine, through the Engine API's archive streams.

On a remote engine the workspace is a volume this host cannot see, so the
tree is read with ``GET /containers/{id}/archive`` (a tar of the workspace)
and written with ``PUT /containers/{id}/archive``. Everything else is
posix-core's version store on this (client) host: blobs, manifests, reading
a version, diff, list, delete and garbage collection are those of
:class:`~corral_posix.TmpdirSnapshotter`.

* **Snapshot**: the tar is parsed into a manifest and every file's content
  is hashed from the stream; only blobs the store lacks are written. The
  tar headers' size and mtime are *not* used to recognise unchanged files:
  the archive carries every byte anyway (hashing it costs less than moving
  it), and mtime in a tar header has whole-second resolution, so a
  same-size rewrite within the second would be missed -- hashing is the
  sound choice at no extra transfer.
* **Restore by difference**: the live tree's manifest (from the same
  archive) is compared with the version's; extras are removed with one
  ``rm -rf`` exec (argv, no shell) as the container user, then one tar of
  only the added and changed entries is PUT. Docker's extraction replaces
  an entry of another type and applies modes, owners (the container user)
  and symlink targets. Every blob the tar needs is read and verified
  *before* anything in the workspace changes, so damaged content fails the
  restore cleanly, naming the version and the path. A journal on this host
  makes a restore a crash interrupted finish at the next resolve.
* **Branch**: the provider makes a new workspace volume and a container on
  it, and the whole version is PUT into it as one tar (every blob verified
  first); the container goes, and resolving the branch's ref starts the
  new workspace's own.

Archives are held in memory, so remote versions are capped lower than local
ones (:data:`REMOTE_CAPS`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import tarfile
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import anyio
import anyio.to_thread

from corral.provider import (
    OperationError,
    ProgressCallback,
    ProgressReporter,
    SnapshotInfo,
    VersionChange,
    WorkspaceRef,
    path_parts,
)
from corral_posix import TmpdirLayout
from corral_posix._blobstore import BlobError, LocalBlobStore
from corral_posix._manifest import Builder, Manifest, diff
from corral_posix._snapshots import MAX_LABEL_LENGTH, _read_small, _write_atomic
from corral_posix._versions import Caps

from ._engine import DockerEngine, EngineError
from ._options import WORKDIR
from ._versions import CommandGate, DockerSnapshotter

__all__ = ["REMOTE_CAPS", "ArchiveSnapshotter", "manifest_from_archive", "restore_archive"]

log = logging.getLogger("corral.docker.versions")

REMOTE_CAPS: Final = Caps(max_entries=200_000, max_bytes=1024**3, max_file_bytes=256 * 1024**2)
"""Bounds of one remote version: its archive is held in memory on this host."""
_TAR_OVERHEAD: Final = 2048
_RM_BATCH: Final = 500
_TOP: Final = os.path.basename(WORKDIR)
_EMPTY_TAR: Final = b"\0" * 1024


def _archive_cap(caps: Caps) -> int:
    return caps.max_bytes + caps.max_entries * _TAR_OVERHEAD


def manifest_from_archive(
    raw: bytes, blobs: LocalBlobStore | None, caps: Caps
) -> tuple[Manifest, list[str]]:
    """The manifest of a workspace archive (``GET /archive`` of the workspace).

    The archive comes from the container and is treated as hostile: names
    are checked component by component, entries whose parent is missing or
    not a directory, duplicates and special files are skipped (and named),
    and the caps apply. Nothing is extracted; file content is hashed (and
    stored in ``blobs`` unless None).

    Raises:
        OperationError: ``too_large`` over a cap; ``failed`` for an archive
            that cannot be read.
    """
    reader = _ArchiveReader(blobs, caps)
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for member in tar.getmembers():
                reader.add(tar, member)
    except tarfile.TarError:
        raise OperationError("docker: the workspace archive is unreadable", code="failed") from None
    if reader.skipped:
        log.warning(
            "snapshot: skipped %d special or unusable entries: %s",
            len(reader.skipped),
            ", ".join(reader.skipped[:20]),
        )
    return reader.b.m, reader.skipped


class _ArchiveReader:
    """Builds a manifest from archive members, parents first."""

    def __init__(self, blobs: LocalBlobStore | None, caps: Caps) -> None:
        self.blobs = blobs
        self.caps = caps
        self.b = Builder(0o755)
        self.where: dict[str, int] = {"": 0}
        self.skipped: list[str] = []
        self.total = 0

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        """Record one member (or skip it, naming it)."""
        name = member.name
        if name == _TOP:
            if member.isdir():
                self.b.m.mode[0] = member.mode & 0o777
            return
        rel = name[len(_TOP) + 1 :] if name.startswith(_TOP + "/") else ""
        parts = rel.split("/")
        if (
            not rel
            or any(p in ("", ".", "..") for p in parts)
            or any(len(p.encode("utf-8", "surrogateescape")) > 255 for p in parts)
        ):
            self.skipped.append("/" + (rel or "?"))
            return
        parent = self.where.get("/".join(parts[:-1]))
        if parent is None or self.b.m.kind[parent] != "d" or rel in self.where:
            self.skipped.append("/" + rel)
            return
        if len(self.b.m.parent) >= self.caps.max_entries:
            raise _too_large(f"{self.caps.max_entries} entries")
        mode = member.mode & 0o777
        if member.isdir():
            self.where[rel] = self.b.add(parent, parts[-1], "d", mode, 0, "", None)
        elif member.issym() and 0 < len(member.linkname) <= 4095:
            target = member.linkname
            size = len(target.encode("utf-8", "surrogateescape"))
            self.where[rel] = self.b.add(parent, parts[-1], "l", 0o777, size, target, None)
        elif member.islnk():
            # A hard link is the content of the entry recorded under its target's name.
            link = member.linkname
            was = self.where.get(link[len(_TOP) + 1 :]) if link.startswith(_TOP + "/") else None
            if was is None or self.b.m.kind[was] != "f":
                self.skipped.append("/" + rel)
                return
            size, digest = self.b.m.size[was], self.b.m.data[was]
            self.where[rel] = self.b.add(parent, parts[-1], "f", mode, size, digest, None)
        elif member.isreg():
            data = self._content(tar, member)
            if data is None:
                self.skipped.append("/" + rel)
                return
            digest = hashlib.sha256(data).hexdigest()
            if self.blobs is not None:
                self.blobs.put(digest, data)
            self.where[rel] = self.b.add(parent, parts[-1], "f", mode, len(data), digest, None)
        else:
            self.skipped.append("/" + rel)

    def _content(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes | None:
        if member.size > self.caps.max_file_bytes:
            raise _too_large(f"a file of {self.caps.max_file_bytes} bytes")
        try:
            stream = tar.extractfile(member)
            data = stream.read() if stream is not None else None
        except KeyError:
            return None
        if data is not None:
            self.total += len(data)
            if self.total > self.caps.max_bytes:
                raise _too_large(f"{self.caps.max_bytes} bytes")
        return data


def _too_large(what: str) -> OperationError:
    return OperationError(
        f"the workspace holds more than {what}; it cannot be snapshotted", code="too_large"
    )


def restore_archive(
    live: Manifest,
    target: Manifest,
    blobs: LocalBlobStore,
    label: str,
    owner: tuple[int, int],
) -> tuple[list[str], bytes | None]:
    """What to remove and the tar to PUT so that ``live`` becomes ``target``.

    Returns:
        Paths (relative, ``./``-prefixed, topmost only) to remove, and the
        tar of the added and changed entries in path order (parents first),
        or None when nothing is to be written.

    Raises:
        OperationError: A blob the tar needs is missing or corrupt (named by
            version and path; nothing has been changed yet).
    """
    changes: list[VersionChange] = [c for c in diff(live, target) if c.path != "/"]
    removals: list[str] = []
    for change in changes:
        if change.change != "removed":
            continue
        if removals and (change.path + "/").startswith(removals[-1] + "/"):
            continue  # under a directory already removed
        removals.append(change.path)
    writes = [c.path for c in changes if c.change != "removed"]
    if not writes:
        return [f".{p}" for p in removals], None
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in writes:
            idx = target.lookup(path_parts(path))
            if idx is None:
                continue
            info = tarfile.TarInfo(path.lstrip("/"))
            info.uid, info.gid = owner
            info.mtime = int(now)
            kind = target.kind[idx]
            if kind == "d":
                info.type = tarfile.DIRTYPE
                info.mode = target.mode[idx]
                tar.addfile(info)
            elif kind == "l":
                info.type = tarfile.SYMTYPE
                info.linkname = target.data[idx]
                info.mode = 0o777
                tar.addfile(info)
            else:
                try:
                    data = blobs.read_verified(target.data[idx], target.size[idx])
                except BlobError as exc:
                    raise OperationError(
                        f"version {label}: the stored content of {path} is {exc.reason}; "
                        "nothing was restored",
                        code="failed",
                    ) from None
                info.size = len(data)
                info.mode = target.mode[idx]
                tar.addfile(info, io.BytesIO(data))
    return [f".{p}" for p in removals], buf.getvalue()


class ArchiveSnapshotter(DockerSnapshotter):
    """Versions of a remote engine's workspace volume (see the module docstring).

    Args:
        layout: The provider's host layout: where this host keeps the
            workspace's versions and the shared blob store.
        workspace: The workspace's name.
        make_ref: Builds the ref of a workspace name.
        engine: The remote engine.
        container: Returns the id of the live container.
        gate: Shared with the workspace's shell.
        user: ``UID:GID`` the container's commands run as.
        uid_gid: The same as numbers: what restored entries are owned by.
        new_workspace: Makes a new remote workspace, calls the given
            coroutine function with the id of a container on its volume,
            and returns the workspace's name (the provider's part of a
            branch); None: branching is unsupported.
        caps: Bounds of one version (archives are held in memory).
    """

    def __init__(
        self,
        layout: TmpdirLayout,
        workspace: str,
        make_ref: Callable[[str], WorkspaceRef],
        *,
        engine: DockerEngine,
        container: Callable[[], Awaitable[str]],
        gate: CommandGate,
        user: str,
        uid_gid: tuple[int, int],
        new_workspace: Callable[[Callable[[str], Awaitable[None]]], Awaitable[str]] | None = None,
        caps: Caps = REMOTE_CAPS,
    ) -> None:
        super().__init__(
            layout,
            workspace,
            make_ref,
            engine=engine,
            container=container,
            gate=gate,
            user=user,
            uid_gid=uid_gid,
        )
        self._caps = caps
        self._uid_gid = uid_gid
        self._new_workspace = new_workspace
        self._archive: bytes | None = None

    # -- the live tree, through the engine --------------------------------------

    async def _fetch(self) -> bytes:
        try:
            container_id = await self._container()
            return await self._engine.get_archive(
                container_id, WORKDIR, max_bytes=_archive_cap(self._caps)
            )
        except EngineError as exc:
            raise OperationError(
                f"docker: could not read the workspace: {exc.message}", code="failed"
            ) from None

    def _scan_live(
        self,
        prev: Manifest | None,
        blobs: LocalBlobStore | None,
        scan_ns: int,
        progress: ProgressReporter | None,
    ) -> tuple[Manifest, list[str]]:
        """The manifest of the archive fetched for this call (see :meth:`_with_archive`)."""
        raw = self._archive
        if raw is None:
            raise RuntimeError("the live tree of a remote workspace is read through _fetch")
        manifest, skipped = manifest_from_archive(raw, blobs, self._caps)
        if progress is not None:
            progress.advance(len(manifest) - 1)
        return manifest, skipped

    def _recover_locked(self) -> None:
        """Journals of remote restores are finished by :meth:`recover` (it needs the engine)."""

    def _ensure_area(self) -> None:
        self._layout.check_base()
        os.makedirs(self._dir, mode=0o700, exist_ok=True)

    async def _with_archive(self, fn: Callable[[], object]) -> object:
        self._archive = await self._fetch()
        try:
            return await anyio.to_thread.run_sync(fn)
        finally:
            self._archive = None

    # -- snapshot / diff -------------------------------------------------------

    async def snapshot(
        self, label: str | None = None, *, on_progress: ProgressCallback | None = None
    ) -> SnapshotInfo:
        """Store a new version of the remote workspace (its archive, hashed as it is read).

        Raises:
            OperationError: Bad label, the tree is over a cap, or the engine failed.
        """
        self._check_open()
        if label is not None and (not isinstance(label, str) or len(label) > MAX_LABEL_LENGTH):
            raise OperationError(
                f"label must be a string of at most {MAX_LABEL_LENGTH} characters",
                code="invalid_argument",
            )
        async with self._lock:
            await self._recover_remote()
            info = await self._with_archive(lambda: self._snapshot_sync(label, on_progress))
        assert isinstance(info, SnapshotInfo)
        return info

    async def diff(self, a: str, b: str | None = None) -> Sequence[VersionChange]:
        """Entries that differ from version ``a`` to ``b`` (or to the live remote tree)."""
        self._check_open()
        if b is not None:
            return await super().diff(a, b)
        async with self._lock:
            changes = await self._with_archive(lambda: self._diff_sync(a, None))
        assert isinstance(changes, list)
        return changes

    # -- restore -----------------------------------------------------------------

    def _plan(self, snapshot_id: str, raw: bytes) -> tuple[list[str], bytes | None]:
        target, _meta = self._manifest(snapshot_id)
        live, _skipped = manifest_from_archive(raw, None, self._caps)
        return restore_archive(live, target, self._store(), snapshot_id, self._uid_gid)

    async def _apply_remote(self, snapshot_id: str) -> None:
        raw = await self._fetch()
        removals, archive = await anyio.to_thread.run_sync(self._plan, snapshot_id, raw)
        journal = self._journal()
        await anyio.to_thread.run_sync(_write_atomic, journal, snapshot_id.encode())
        try:
            container_id = await self._container()
            for start in range(0, len(removals), _RM_BATCH):
                out = await self._engine.exec(
                    container_id,
                    ["rm", "-rf", "--", *removals[start : start + _RM_BATCH]],
                    env={},
                    workdir=WORKDIR,
                    user=self._user,
                    max_output_bytes=4096,
                )
                if out.exit_code != 0:
                    raise OperationError(
                        "docker: the restore could not remove entries added since the version",
                        code="failed",
                    )
            if archive is not None:
                await self._engine.put_archive(container_id, WORKDIR, archive)
        except EngineError as exc:
            raise OperationError(
                f"docker: the restore failed: {exc.message}; it is finished at the next resolve",
                code="failed",
            ) from None
        await anyio.to_thread.run_sync(os.unlink, journal)

    async def _recover_remote(self) -> None:
        try:
            raw = await anyio.to_thread.run_sync(_read_small, self._journal(), 1024)
        except FileNotFoundError:
            return
        except (OSError, ValueError):
            raw = b""
        snapshot_id = raw.decode("ascii", "replace")
        log.warning("snapshot: finishing a restore that was interrupted")
        try:
            await self._apply_remote(snapshot_id)
        except OperationError:
            log.warning("snapshot: the interrupted restore cannot be finished; left as it is")
            with contextlib.suppress(FileNotFoundError):
                await anyio.to_thread.run_sync(os.unlink, self._journal())

    async def recover(self) -> None:
        """Make the versions area on this host, and finish a restore a crash interrupted."""
        await anyio.to_thread.run_sync(self._ensure_area)
        async with self._lock:
            await self._recover_remote()

    async def restore(
        self, snapshot_id: str, *, on_progress: ProgressCallback | None = None
    ) -> WorkspaceRef:
        """Stop the commands in flight, then restore the remote tree by difference.

        Raises:
            OperationError: Unknown id, damaged stored content (nothing is
                changed then), or the engine failed.
        """
        self._check_open()
        await anyio.to_thread.run_sync(self._meta, snapshot_id)
        done = self._gate.close()
        try:
            await self._kill_commands()
            async with self._lock:
                await self._recover_remote()
                await self._apply_remote(snapshot_id)
        finally:
            self._gate.open(done)
        return self._make_ref(self._name)

    def _whole(self, snapshot_id: str) -> bytes:
        target, _meta = self._manifest(snapshot_id)
        empty = Builder(target.mode[0]).m
        _removals, archive = restore_archive(
            empty, target, self._store(), snapshot_id, self._uid_gid
        )
        return archive if archive is not None else _EMPTY_TAR

    async def branch(
        self, snapshot_id: str, *, on_progress: ProgressCallback | None = None
    ) -> WorkspaceRef:
        """A new remote workspace holding the version (this one is unchanged).

        Raises:
            OperationError: Unknown id, damaged stored content (no workspace
                is made then), or the engine failed.
        """
        self._check_open()
        archive = await anyio.to_thread.run_sync(self._whole, snapshot_id)
        if self._new_workspace is None:
            raise OperationError("docker: this workspace cannot make branches", code="unsupported")

        async def fill(container_id: str) -> None:
            await self._engine.put_archive(container_id, WORKDIR, archive)

        try:
            name = await self._new_workspace(fill)
        except EngineError as exc:
            raise OperationError(
                f"docker: the branch could not be made: {exc.message}", code="failed"
            ) from None
        return self._make_ref(name)
