"""Where version content lives: a content-addressed blob store behind a small interface.

The seam for an object store: implement :class:`BlobStore` (four blocking
methods keyed by SHA-256 hex digest) on S3/GCS/... and pass it to the
service. The contract an implementation must keep:

* ``put`` returns only once the blob is durable (a version row naming it is
  committed right after, and must never point at a blob a crash lost);
* ``get`` verifies the digest of what it returns (a damaged blob is an
  error, never content);
* blobs are immutable, so ``put`` of an existing digest is a no-op and any
  replica may read what another wrote.

Only :class:`LocalBlobStore` (a directory on local disk) exists today; the
methods are blocking and the service calls them from worker threads.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
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
        """Store ``data`` (temp file, fsync, rename, fsync the directory)."""
        digest = hashlib.sha256(data).hexdigest()
        path = self._path(digest)
        if os.path.exists(path):
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
        return os.path.exists(self._path(digest))

    def delete(self, digest: str) -> None:
        """Remove the blob file."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(digest))
