"""Where version content lives: a content-addressed blob store behind a small interface.

The seam for an object store: implement :class:`BlobStore` (four blocking
methods keyed by SHA-256 hex digest) on S3/GCS/... and pass it to the
service. The contract an implementation must keep:

* ``put`` returns only once the blob is durable (a version row naming it is
  committed right after, and must never point at a blob a crash lost);
* ``get`` verifies the digest of what it returns (a damaged blob is an
  error, never content);
* blobs are immutable, so ``put`` of an existing digest stores nothing new
  and any replica may read what another wrote -- but it *refreshes the
  blob's written time*: the garbage collector never removes a blob written
  or re-put after the oldest live capture started (or within its grace
  period), and that is what protects the blobs of a version being taken
  (see :mod:`corral_server._gc`);
* ``list`` yields every blob with its last written time, and
  ``collect(digest, cutoff)`` removes a blob only if it was not written
  since ``cutoff``, decided atomically with respect to a concurrent ``put``
  (a ``put`` that returned leaves the blob stored).

Only :class:`LocalBlobStore` (a directory on local disk) exists today; the
methods are blocking and the service calls them from worker threads.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import time
from collections.abc import Iterator
from typing import Final, Protocol, runtime_checkable

from ._errors import ServiceError

__all__ = ["BlobStore", "LocalBlobStore"]

_DIGEST_RE: Final = re.compile(r"[0-9a-f]{64}")


@runtime_checkable
class BlobStore(Protocol):
    """Immutable blobs named by the SHA-256 of their content (blocking calls)."""

    def put(self, data: bytes) -> str:
        """Store ``data`` durably; return its digest."""
        ...

    def get(self, digest: str, max_bytes: int | None = None) -> bytes:
        """A blob's verified content.

        Raises:
            ServiceError: ``not_found`` for a missing blob, ``too_large`` past
                ``max_bytes``, ``failed`` when the content does not match.
        """
        ...

    def has(self, digest: str) -> bool:
        """Whether the blob is stored."""
        ...

    def delete(self, digest: str) -> None:
        """Remove a blob (missing is fine)."""
        ...

    def list(self) -> Iterator[tuple[str, float]]:
        """Every stored blob as ``(digest, last written time)`` (Unix seconds)."""
        ...

    def collect(self, digest: str, cutoff: float) -> bool:
        """Remove a blob unless it was written or re-put at or after ``cutoff``.

        Returns whether it was removed. Atomic with respect to ``put``: a
        ``put`` of the digest that returned, before or during this call,
        leaves the blob stored.
        """
        ...


class LocalBlobStore:
    """Blobs as files ``<root>/<2 hex>/<62 hex>``, written atomically and fsynced.

    Args:
        root: The directory (created when missing).
    """

    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(root, mode=0o700, exist_ok=True)

    def _path(self, digest: str) -> str:
        if not _DIGEST_RE.fullmatch(digest):
            raise ServiceError("not a blob digest", code="failed")
        return os.path.join(self.root, digest[:2], digest[2:])

    def put(self, data: bytes) -> str:
        """Store ``data`` (temp file, fsync, rename, fsync the directory).

        An existing blob is not rewritten; its mtime is refreshed (the
        written time the collector's grace period counts from).
        """
        digest = hashlib.sha256(data).hexdigest()
        path = self._path(digest)
        try:
            os.utime(path)
        except FileNotFoundError:
            pass  # new, or being collected this instant: write it
        else:
            return digest
        folder = os.path.dirname(path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        tmp = f"{path}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return digest

    def get(self, digest: str, max_bytes: int | None = None) -> bytes:
        """Read and verify a blob."""
        path = self._path(digest)
        if not os.path.exists(path):
            self._recover(path)
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if max_bytes is not None and size > max_bytes:
                    raise ServiceError(
                        f"the file is larger than {max_bytes} bytes", code="too_large"
                    )
                data = fh.read()
        except FileNotFoundError:
            raise ServiceError("stored content is missing", code="failed") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise ServiceError("stored content failed verification", code="failed")
        return data

    def has(self, digest: str) -> bool:
        """Whether the blob file exists."""
        path = self._path(digest)
        return os.path.exists(path) or self._recover(path)

    def _recover(self, path: str) -> bool:
        """Put back a blob a collector killed mid-``collect`` left renamed aside.

        ``collect`` renames a blob to ``<name>.<random>.trash`` before its
        final check; a crash right there would leave a blob that a version
        may reference away from its name. Any reader that misses a blob
        looks for such a file and renames it back (content-addressed, so
        that is always right).
        """
        folder, name = os.path.split(path)
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return False
        for other in names:
            if other.startswith(name + ".") and other.endswith(".trash"):
                with contextlib.suppress(FileNotFoundError):
                    os.rename(os.path.join(folder, other), path)
                    return True
        return False

    def list(self) -> Iterator[tuple[str, float]]:
        """Every blob with its mtime; tidies debris of crashed ``put`` and ``collect`` calls.

        A ``.trash`` file whose blob is missing is renamed back (see
        :meth:`_recover`), one whose blob exists is removed; a ``.tmp`` file
        (a ``put`` that died before its rename) older than an hour is removed.
        """
        try:
            folders = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return
        for folder in folders:
            if not re.fullmatch(r"[0-9a-f]{2}", folder):
                continue
            base = os.path.join(self.root, folder)
            for name in sorted(os.listdir(base)):
                path = os.path.join(base, name)
                if name.endswith(".trash"):
                    blob = os.path.join(base, name.split(".", 1)[0])
                    with contextlib.suppress(FileNotFoundError):
                        if os.path.exists(blob):
                            os.unlink(path)
                        else:
                            os.rename(path, blob)
                            yield folder + name.split(".", 1)[0], os.stat(blob).st_mtime
                    continue
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue
                if name.endswith(".tmp"):
                    if st.st_mtime < time.time() - 3600:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(path)
                    continue
                if _DIGEST_RE.fullmatch(folder + name):
                    yield folder + name, st.st_mtime

    def collect(self, digest: str, cutoff: float) -> bool:
        """Rename aside, re-check the mtime (a racing ``put`` refreshes it), then unlink.

        The rename makes the decision atomic: a ``put`` that refreshed the
        blob before it shows in the re-check (the blob is put back); one
        that comes after finds no file and writes a new one.
        """
        path = self._path(digest)
        aside = f"{path}.{secrets.token_hex(6)}.trash"
        try:
            if os.stat(path).st_mtime >= cutoff:
                return False
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        # A reader (or another collector's tidying) may have put it back meanwhile.
        try:
            if os.stat(aside).st_mtime >= cutoff:
                os.rename(aside, path)
                return False
            os.unlink(aside)
        except FileNotFoundError:
            return False
        return True

    def delete(self, digest: str) -> None:
        """Remove the blob file."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(digest))
