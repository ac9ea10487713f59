"""corral-posix-core: shared POSIX plumbing for corral providers.

Race-free filesystem beneath a directory fd, guarded subprocess shell, the
CommandWrapper seam for OS sandboxes, and the tmpdir workspace layout and
snapshot store that local-bash, local-sandbox and docker share.
"""

from __future__ import annotations

from ._checker import CheckedCommand, CommandChecker
from ._fdtree import remove_tree_at
from ._fs import TmpdirFileSystem
from ._layout import TmpdirLayout, TmpdirRefPayload, remove_tree, sanitize_session_id
from ._processes import (
    HostProcessManager,
    ProcessChecks,
    check_stream_read,
    read_recorded_stream,
)
from ._provider import Isolation, TmpdirWorkspaceProvider
from ._resolve import Resolver, open_beneath, openat2_available
from ._shell import ProcessLimits, SubprocessShell
from ._snapshots import Reattachable, TmpdirSnapshotter, exchange_dirs
from ._wrapper import (
    IDENTITY_WRAPPER,
    CommandWrapper,
    IdentityWrapper,
    WrapContext,
    WrappedCommand,
)

__all__: list[str] = [
    "IDENTITY_WRAPPER",
    "CheckedCommand",
    "CommandChecker",
    "CommandWrapper",
    "HostProcessManager",
    "IdentityWrapper",
    "Isolation",
    "ProcessChecks",
    "ProcessLimits",
    "Reattachable",
    "Resolver",
    "SubprocessShell",
    "TmpdirFileSystem",
    "TmpdirLayout",
    "TmpdirRefPayload",
    "TmpdirSnapshotter",
    "TmpdirWorkspaceProvider",
    "WrapContext",
    "WrappedCommand",
    "check_stream_read",
    "exchange_dirs",
    "open_beneath",
    "openat2_available",
    "read_recorded_stream",
    "remove_tree",
    "remove_tree_at",
    "sanitize_session_id",
]
