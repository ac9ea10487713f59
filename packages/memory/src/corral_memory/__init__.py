"""corral-memory: the ``in-memory`` workspace provider.

A real directory tree held in process memory, with snapshots. For tests,
demos and ephemeral agents: nothing survives the process, and resolving a
ref after a restart reports the workspace as lost.
"""

from __future__ import annotations

from ._fs import InMemoryFileSystem
from ._provider import (
    PROVIDER_ID,
    SCHEMA_VERSION,
    SUPPORTED_CAPABILITIES,
    InMemoryProvider,
    RefPayload,
)
from ._snapshot import InMemorySnapshotter
from ._store import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_GREP_FILE_BYTES,
    DEFAULT_MAX_SNAPSHOTS,
    DEFAULT_MAX_WORKSPACE_BYTES,
    Limits,
)
from ._tree import ENTRY_OVERHEAD

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MAX_GREP_FILE_BYTES",
    "DEFAULT_MAX_SNAPSHOTS",
    "DEFAULT_MAX_WORKSPACE_BYTES",
    "ENTRY_OVERHEAD",
    "PROVIDER_ID",
    "SCHEMA_VERSION",
    "SUPPORTED_CAPABILITIES",
    "InMemoryFileSystem",
    "InMemoryProvider",
    "InMemorySnapshotter",
    "Limits",
    "RefPayload",
]
