"""Versions of a durable workspace: manifests in the blob store, read without a live box.

A version is a manifest (JSON: agent path -> ``[type, mode, size, digest]``)
stored as a blob, plus a row in the store naming it. It is taken from a live
workspace through the provider contract only (its ``fs`` module: ``ls``,
``stat``, ``read_file``), so any provider works, and written back into a
freshly opened box the same way. Reads (``read``/``ls``/``stat``) need just
the manifest and the blobs: no provider is opened.

The service owns these versions (not the provider's own snapshot store):
a materialization is closed at stop, which releases the provider's data,
and the next materialization may be on another provider instance, machine
or replica.

A version carries regular files with their permission bits, directories
with theirs, and symlinks *as links* (the target text; never followed, so a
link out of the workspace pulls nothing in). The ``fs`` contract reports
links and modes but cannot read a target or set a mode, so those two go
through the box's ``shell`` (:mod:`corral_server._linkmodes`). A box
without a shell module cannot carry them: its links are left out and its
modes are not re-applied (logged). Special files (FIFOs, sockets, devices)
are never carried.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final

import anyio
import anyio.to_thread

from corral.provider import (
    FileEntry,
    FileStat,
    FileSystem,
    OperationError,
    Shell,
    join_path,
    path_parts,
)

from ._blobs import BlobStore
from ._errors import ServiceError
from ._linkmodes import MODE_MASK, apply_modes, make_links, read_links

__all__ = ["EMPTY_MANIFEST", "Manifest", "VersionReader", "capture", "restore"]

log = logging.getLogger("corral.server.versions")

Manifest = dict[str, tuple[str, int, int, str]]
"""Agent path -> (type, mode, size, digest); ``/`` is always a directory.

A ``symlink`` entry keeps its target text where a file keeps its digest
(and the target's length as its size)."""

EMPTY_MANIFEST: Final[Manifest] = {"/": ("dir", 0o755, 0, "")}
MAX_ENTRIES: Final = 200_000
_CACHE: Final = 256


def encode(manifest: Manifest) -> bytes:
    """The stored form of a manifest (sorted, compact JSON)."""
    body = {"v": 1, "entries": {p: list(e) for p, e in sorted(manifest.items())}}
    return json.dumps(body, separators=(",", ":")).encode()


def decode(raw: bytes) -> Manifest:
    """Parse a stored manifest (it was verified by digest on the way in)."""
    body = json.loads(raw)
    if not isinstance(body, dict) or body.get("v") != 1:
        raise ServiceError("a stored version has an unknown format", code="failed")
    return {p: (e[0], int(e[1]), int(e[2]), e[3]) for p, e in body["entries"].items()}


def _clean(path: object) -> str:
    """An agent path normalised (``src/a`` and ``/src/a`` are the same file)."""
    if not isinstance(path, str) or len(path) > 4096:
        raise ServiceError("path must be a string of at most 4096 characters")
    try:
        parts = path_parts(path)
    except OperationError:
        raise ServiceError("path is not a valid workspace path") from None
    return "/" + "/".join(parts)


class VersionReader:
    """Reads files of versions from their manifests and the blob store (no live box).

    Parsed manifests are cached (they are immutable), so a read after the
    first one of a version costs one blob read.
    """

    def __init__(self, blobs: BlobStore) -> None:
        self._blobs = blobs
        self._cache: OrderedDict[str, Manifest] = OrderedDict()

    def manifest_sync(self, digest: str) -> Manifest:
        """A version's manifest (blocking; cached)."""
        hit = self._cache.get(digest)
        if hit is not None:
            self._cache.move_to_end(digest)
            return hit
        manifest = decode(self._blobs.get(digest))
        self._cache[digest] = manifest
        while len(self._cache) > _CACHE:
            self._cache.popitem(last=False)
        return manifest

    def _entry(self, digest: str, path: object) -> tuple[str, tuple[str, int, int, str]]:
        clean = _clean(path)
        entry = self.manifest_sync(digest).get(clean)
        if entry is None:
            raise ServiceError("no such file or directory in that version", code="not_found")
        return clean, entry

    def read_sync(self, digest: str, path: object, max_bytes: int) -> bytes:
        """A file's content in a version."""
        _, (kind, _mode, size, blob) = self._entry(digest, path)
        if kind == "symlink":
            raise ServiceError("that path is a symbolic link (never followed)")
        if kind != "file":
            raise ServiceError("that path is a directory", code="invalid_argument")
        if size > max_bytes:
            raise ServiceError(f"the file is larger than {max_bytes} bytes", code="too_large")
        return self._blobs.get(blob, max_bytes)

    def stat_sync(self, digest: str, path: object, mtime: float) -> FileStat:
        """A path's metadata in a version (``mtime`` is the version's time)."""
        clean, (kind, mode, size, _blob) = self._entry(digest, path)
        return FileStat(path=clean, type=kind, size=size, mtime=mtime, mode=mode)  # type: ignore[arg-type]

    def ls_sync(self, digest: str, path: object) -> list[FileEntry]:
        """A directory's entries in a version, sorted by name."""
        clean, (kind, *_rest) = self._entry(digest, path)
        if kind != "dir":
            raise ServiceError("that path is not a directory", code="invalid_argument")
        prefix = "/" if clean == "/" else clean + "/"
        out = []
        for p, (k, _m, size, _b) in self.manifest_sync(digest).items():
            if p != "/" and p.startswith(prefix) and "/" not in p[len(prefix) :]:
                out.append(FileEntry(name=p[len(prefix) :], path=p, type=k, size=size))  # type: ignore[arg-type]
        return sorted(out, key=lambda e: e.name)


def _child(folder: str, name: object) -> str | None:
    """The agent path of a listed name, or None for a name no listing should produce."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\0" in name:
        return None
    return join_path(folder, name)


async def capture(
    fs: FileSystem, blobs: BlobStore, shell: Shell | None = None
) -> tuple[bytes, int, int]:
    """Copy a live workspace's tree into the blob store; return (manifest, files, bytes).

    Files and directories come through ``fs`` (with their modes); link
    targets through ``shell`` (see :mod:`corral_server._linkmodes`).

    Raises:
        ServiceError: ``too_large`` past :data:`MAX_ENTRIES` entries;
            ``failed`` when the box could not report its links.
    """
    manifest: Manifest = {"/": ("dir", (await fs.stat("/")).mode & MODE_MASK, 0, "")}
    links: list[tuple[str, int]] = []
    todo = ["/"]
    files = total = 0
    while todo:
        folder = todo.pop()
        entries: Sequence[FileEntry] = await fs.ls(folder)
        for entry in entries:
            if len(manifest) + len(links) >= MAX_ENTRIES:
                raise ServiceError(
                    f"the workspace holds more than {MAX_ENTRIES} entries", code="too_large"
                )
            path = _child(folder, entry.name)
            if path is None:
                log.warning("a listing returned an unusable name; left out of the version")
                continue
            if entry.type == "dir":
                st = await fs.stat(path)
                manifest[path] = ("dir", st.mode & MODE_MASK, 0, "")
                todo.append(path)
            elif entry.type == "file":
                st = await fs.stat(path)
                data = await fs.read_file(path)
                digest = await anyio.to_thread.run_sync(blobs.put, data)
                manifest[path] = ("file", st.mode & MODE_MASK, len(data), digest)
                files += 1
                total += len(data)
            elif entry.type == "symlink":
                links.append((path, (await fs.stat(path)).mode & MODE_MASK))
    if links and shell is None:
        log.warning("the box has no shell module: %d symlinks left out of the version", len(links))
    elif links:
        assert shell is not None
        targets = await read_links(shell, [p for p, _m in links])
        for path, mode in links:
            # Left out by read_links: it vanished meanwhile, or the box cannot
            # read it (a path local-sandbox protects): logged there, not fatal.
            target = targets.get(path)
            if target is not None:
                manifest[path] = ("symlink", mode, len(target.encode()), target)
    return encode(manifest), files, total


_REFUSED: Final = frozenset({"policy_denied", "permission_denied"})
"""Operation codes by which a box refuses a path it may not hold (never an I/O failure)."""


def _checked(manifest: Manifest) -> list[tuple[str, tuple[str, int, int, str]]]:
    """Entries sorted by path, each under a directory of the manifest (else ``failed``).

    A stored manifest is ours, but a parent that is a link would make a
    write go through it: refused rather than trusted.
    """
    for path in manifest:
        if path == "/":
            continue
        parent = path.rsplit("/", 1)[0] or "/"
        if manifest.get(parent, ("",))[0] != "dir":
            raise ServiceError("a stored version is inconsistent", code="failed")
    return sorted(manifest.items())


async def restore(
    fs: FileSystem, blobs: BlobStore, manifest: Manifest, shell: Shell | None = None
) -> None:
    """Write a version's tree into a freshly opened (empty) workspace.

    Directories, then files (through ``fs``), then links, then the modes
    that differ from what the box created (through ``shell``), directories
    deepest first. A path the box's policy refuses (``policy_denied`` or
    ``permission_denied``: a protected path of local-sandbox) is left out
    of this box and logged; the version keeps it.
    """
    entries = _checked(manifest)
    refused: set[str] = set()
    for path, (kind, _mode, _size, digest) in entries:
        if path == "/" or kind not in ("dir", "file"):
            continue
        try:
            if kind == "dir":
                await fs.mkdir(path, parents=True)
            else:
                data = await anyio.to_thread.run_sync(blobs.get, digest)
                await fs.write_file(path, data)
        except OperationError as exc:
            # The box's policy refuses the path (a path local-sandbox
            # protects, say): the path is lost to this box, not the version.
            if exc.code not in _REFUSED:
                raise
            refused.add(path)
    if refused:
        log.warning("the box refused %d paths of the version; left out", len(refused))
    links = [(path, target) for path, (kind, _m, _s, target) in entries if kind == "symlink"]
    if shell is None:
        if links:
            log.warning("the box has no shell module: %d symlinks not restored", len(links))
        return
    await make_links(shell, links)
    changes: list[tuple[str, int]] = []
    for path, (kind, mode, _size, _digest) in entries:
        if kind not in ("file", "dir") or path in refused:
            continue
        if (await fs.stat(path)).mode & MODE_MASK != mode:
            changes.append((path, mode))
    files = [(p, m) for p, m in changes if manifest[p][0] == "file"]
    dirs = sorted(
        ((p, m) for p, m in changes if manifest[p][0] == "dir"),
        key=lambda pm: pm[0].count("/"),
        reverse=True,
    )
    await apply_modes(shell, files + dirs)


def manifest_json(manifest: Manifest) -> list[dict[str, Any]]:
    """A manifest as a JSON list (for diagnostics)."""
    return [
        {"path": p, "type": k, "mode": m, "size": s}
        for p, (k, m, s, _d) in sorted(manifest.items())
    ]
