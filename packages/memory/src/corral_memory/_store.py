"""The process-wide store of in-memory workspaces, keyed by random ids.

State lives here rather than on a provider instance so that any
``InMemoryProvider`` in the process can resolve a ref (the registry may
build a new provider after a restart of its own), while sessions still never
share state: each ``open`` or ``branch`` makes a new random id.

A random per-process token goes into every ref. A ref carrying another
token was made by a process that has since exited (or by a parent before a
fork), so its workspace is reported lost instead of being silently replaced
by an empty one.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from typing import Final

import attrs

from corral.provider import DEFAULT_MAX_FILE_BYTES

from ._tree import Tree

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MAX_GREP_FILE_BYTES",
    "DEFAULT_MAX_SNAPSHOTS",
    "DEFAULT_MAX_WORKSPACE_BYTES",
    "Limits",
    "StoredSnapshot",
    "WorkspaceState",
    "discard",
    "find",
    "new_workspace",
    "process_token",
]

DEFAULT_MAX_WORKSPACE_BYTES: Final = 256 * 1024 * 1024
DEFAULT_MAX_GREP_FILE_BYTES: Final = 16 * 1024 * 1024
DEFAULT_MAX_SNAPSHOTS: Final = 64

_ID_PREFIX: Final = "mem-"


@attrs.frozen
class Limits:
    """Per-workspace bounds, fixed when the workspace is created.

    Attributes:
        max_workspace_bytes: Budget for file contents plus per-entry overhead.
        max_file_bytes: Largest single file.
        max_grep_file_bytes: Larger files are listed in ``skipped_paths`` by grep.
        max_snapshots: Snapshots one workspace may hold at once.
    """

    max_workspace_bytes: int = DEFAULT_MAX_WORKSPACE_BYTES
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_grep_file_bytes: int = DEFAULT_MAX_GREP_FILE_BYTES
    max_snapshots: int = DEFAULT_MAX_SNAPSHOTS


@attrs.frozen
class StoredSnapshot:
    """A snapshot's description and its frozen tree (never mutated)."""

    snapshot_id: str
    created_at: float
    label: str | None
    tree: Tree


@attrs.define(eq=False)
class WorkspaceState:
    """Everything one workspace holds.

    ``lock`` is a thread lock taken around each synchronous section of an
    operation and never held across an ``await``: within one event loop the
    operations are already atomic (no await mid-mutation); the lock keeps them
    atomic when several threads share the process.
    """

    workspace_id: str
    limits: Limits
    tree: Tree
    snapshots: dict[str, StoredSnapshot] = attrs.field(factory=dict)
    closed: bool = False
    created_at: float = attrs.field(factory=time.time)
    lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False)


class _Process:
    token = secrets.token_hex(16)


_store: dict[str, WorkspaceState] = {}


def _after_fork_in_child() -> None:
    # A forked child holds a private copy of every workspace; refs minted by
    # the parent must not resolve to that diverging copy.
    _Process.token = secrets.token_hex(16)
    _store.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def process_token() -> str:
    """The random token that identifies this process in refs."""
    return _Process.token


def new_workspace(limits: Limits, tree: Tree | None = None) -> WorkspaceState:
    """Create and register a workspace with a fresh random id."""
    state = WorkspaceState(
        workspace_id=_ID_PREFIX + secrets.token_hex(16),
        limits=limits,
        tree=tree if tree is not None else Tree.empty(time.time()),
    )
    _store[state.workspace_id] = state
    return state


def find(workspace_id: str) -> WorkspaceState | None:
    """The live workspace with this id, or None when closed or unknown."""
    state = _store.get(workspace_id)
    return None if state is None or state.closed else state


def discard(state: WorkspaceState) -> None:
    """Close a workspace: drop it and its snapshots from the store. Idempotent."""
    with state.lock:
        state.closed = True
        state.snapshots.clear()
        state.tree = Tree.empty(state.tree.root.mtime)
    _store.pop(state.workspace_id, None)
