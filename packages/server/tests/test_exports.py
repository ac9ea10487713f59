"""The public surface of corral_server, pinned."""

from __future__ import annotations

import corral_server

EXPECTED = {
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
}


def test_public_names() -> None:
    assert set(corral_server.__all__) == EXPECTED
    for name in EXPECTED:
        obj = getattr(corral_server, name)
        assert getattr(obj, "__doc__", None), name
