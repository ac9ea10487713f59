"""corral-server: durable workspaces over HTTP (``corral serve``).

A workspace here is a durable object: created from a pinned sandbox
definition, listed and updated, its files readable from stored versions
without starting anything, materialised into a live box on demand, with
exec and PTY handles whose output is read by byte cursor. State lives in
SQLite (default) or PostgreSQL (replicas); version content in a blob store.
"""

from __future__ import annotations

from ._blobs import BlobStore, LocalBlobStore
from ._client import ApiError, AsyncClient, Client, StreamEvent, client_settings
from ._errors import ServiceError
from ._gc import GcReport
from ._model import SandboxDefinition, check_mount_path
from ._remote import DurableWorkspaceProvider
from ._serve import serve
from ._service import ProviderFactory, WorkspaceService, hash_token
from ._store import SqlStore, open_store

__all__ = [
    "ApiError",
    "AsyncClient",
    "BlobStore",
    "Client",
    "DurableWorkspaceProvider",
    "GcReport",
    "LocalBlobStore",
    "ProviderFactory",
    "SandboxDefinition",
    "ServiceError",
    "SqlStore",
    "StreamEvent",
    "WorkspaceService",
    "check_mount_path",
    "client_settings",
    "hash_token",
    "open_store",
    "serve",
]
