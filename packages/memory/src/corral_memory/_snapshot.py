"""Snapshots of an in-memory workspace: structural copies of its tree.

A snapshot copies directory nodes and shares the immutable file nodes, so
taking one costs one dict per directory whatever the data size. Restoring
copies the snapshot's tree back (the snapshot itself is never mutated) and
keeps the workspace's identity, so ``restore`` returns the same ref.
Snapshots do not count against the byte budget (they share file data with
the live tree); ``max_snapshots`` bounds how many a workspace holds.

The snapshotter is also a :class:`corral.provider.Versions`: reading at a version
runs the ordinary in-memory file system over a private copy of the
snapshot's tree (one dict per directory), and ``diff`` compares two trees
node by node (file nodes are shared, so unchanged files compare by identity).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from typing import Final, Literal

import anyio.lowlevel

from corral.provider import (
    FileEntry,
    FileStat,
    GrepOptions,
    GrepResult,
    Matcher,
    OperationError,
    SnapshotInfo,
    VersionChange,
    WorkspaceRef,
    echo_if_short,
    workspace_closed,
)

from ._fs import InMemoryFileSystem
from ._store import StoredSnapshot, WorkspaceState, new_workspace
from ._tree import DirNode, FileNode, Node, walk

__all__ = ["MAX_LABEL_LENGTH", "InMemorySnapshotter"]

MAX_LABEL_LENGTH: Final = 200


def _info(snap: StoredSnapshot) -> SnapshotInfo:
    return SnapshotInfo(
        snapshot_id=snap.snapshot_id,
        created_at=snap.created_at,
        label=snap.label,
        size_bytes=snap.tree.file_bytes,
    )


def _unknown(snapshot_id: str) -> OperationError:
    shown = echo_if_short(snapshot_id, fallback="given")
    return OperationError(f"no snapshot {shown!r} in this workspace", code="not_found")


class InMemorySnapshotter:
    """Point-in-time copies of one in-memory workspace (see :class:`corral.provider.Snapshotter`).

    Args:
        state: The workspace's state in the process-wide store.
        make_ref: Builds the ref of a workspace id (same capabilities as this one).
    """

    def __init__(self, state: WorkspaceState, make_ref: Callable[[str], WorkspaceRef]) -> None:
        self._state = state
        self._make_ref = make_ref

    async def _enter(self) -> WorkspaceState:
        await anyio.lowlevel.checkpoint()
        if self._state.closed:
            raise workspace_closed()
        return self._state

    @staticmethod
    def _check_id(snapshot_id: object) -> str:
        if not isinstance(snapshot_id, str) or not snapshot_id:
            raise OperationError("snapshot_id must be a non-empty string", code="invalid_argument")
        return snapshot_id

    def _get(self, state: WorkspaceState, snapshot_id: str) -> StoredSnapshot:
        snap = state.snapshots.get(snapshot_id)
        if snap is None:
            raise _unknown(snapshot_id)
        return snap

    async def snapshot(self, label: str | None = None) -> SnapshotInfo:
        """Store the current tree and describe the snapshot."""
        if label is not None and (not isinstance(label, str) or len(label) > MAX_LABEL_LENGTH):
            raise OperationError(
                f"label must be a string of at most {MAX_LABEL_LENGTH} characters",
                code="invalid_argument",
            )
        state = await self._enter()
        with state.lock:
            cap = state.limits.max_snapshots
            if len(state.snapshots) >= cap:
                raise OperationError(
                    f"this workspace already holds {cap} snapshots; delete one first",
                    code="too_large",
                )
            snap = StoredSnapshot(
                snapshot_id="snap-" + secrets.token_hex(12),
                created_at=time.time(),
                label=label,
                tree=state.tree.copy(),
            )
            state.snapshots[snap.snapshot_id] = snap
        return _info(snap)

    async def restore(self, snapshot_id: str) -> WorkspaceRef:
        """Replace the workspace's tree with the snapshot's; return the same ref."""
        snapshot_id = self._check_id(snapshot_id)
        state = await self._enter()
        with state.lock:
            state.tree = self._get(state, snapshot_id).tree.copy()
        return self._make_ref(state.workspace_id)

    async def list(self) -> Sequence[SnapshotInfo]:
        """Snapshots of this workspace, oldest first."""
        state = await self._enter()
        with state.lock:
            snaps = list(state.snapshots.values())
        return [_info(snap) for snap in snaps]

    async def delete(self, snapshot_id: str) -> None:
        """Forget a snapshot; an unknown id is ``not_found``."""
        snapshot_id = self._check_id(snapshot_id)
        state = await self._enter()
        with state.lock:
            self._get(state, snapshot_id)
            del state.snapshots[snapshot_id]

    async def branch(self, snapshot_id: str) -> WorkspaceRef:
        """Create a new workspace (new id, no snapshots) seeded from a snapshot."""
        snapshot_id = self._check_id(snapshot_id)
        state = await self._enter()
        with state.lock:
            tree = self._get(state, snapshot_id).tree.copy()
        branch = new_workspace(state.limits, tree)
        return self._make_ref(branch.workspace_id)

    # -- reading versions (corral.provider.Versions) ------------------------------------

    async def _fs_at(self, snapshot_id: str) -> tuple[InMemoryFileSystem, float]:
        snapshot_id = self._check_id(snapshot_id)
        state = await self._enter()
        with state.lock:
            snap = self._get(state, snapshot_id)
            tree = snap.tree.copy()
        # A private state outside the process-wide store: nothing can resolve
        # or change it, and the snapshot's own tree is never handed out.
        view = WorkspaceState(workspace_id=state.workspace_id, limits=state.limits, tree=tree)
        return InMemoryFileSystem(view), snap.created_at

    async def read_file_at(
        self, snapshot_id: str, path: str, *, max_bytes: int | None = None
    ) -> bytes:
        """A file's content in a snapshot."""
        fs, _created = await self._fs_at(snapshot_id)
        return await fs.read_file(path, max_bytes=max_bytes)

    async def ls_at(self, snapshot_id: str, path: str = "/") -> Sequence[FileEntry]:
        """A directory's listing in a snapshot."""
        fs, _created = await self._fs_at(snapshot_id)
        return await fs.ls(path)

    async def stat_at(self, snapshot_id: str, path: str) -> FileStat:
        """A path's metadata in a snapshot (``mtime`` is the snapshot's time)."""
        fs, created = await self._fs_at(snapshot_id)
        st = await fs.stat(path)
        return FileStat(path=st.path, type=st.type, size=st.size, mtime=created, mode=st.mode)

    async def grep_at(self, snapshot_id: str, matcher: Matcher, options: GrepOptions) -> GrepResult:
        """Search a snapshot's files."""
        fs, _created = await self._fs_at(snapshot_id)
        return await fs.grep(matcher, options)

    async def diff(self, a: str, b: str | None = None) -> Sequence[VersionChange]:
        """Entries that differ from snapshot ``a`` to snapshot ``b`` (or the live tree)."""
        a = self._check_id(a)
        state = await self._enter()
        with state.lock:
            old = self._get(state, a).tree.root
            new = state.tree.root if b is None else self._get(state, self._check_id(b)).tree.root
            before = dict(walk(old))
            after = dict(walk(new))
        out: list[VersionChange] = []
        if old.mode != new.mode:
            out.append(
                VersionChange(path="/", change="modified", type="dir", old_size=0, new_size=0)
            )
        for rel, node in before.items():
            other = after.get(rel)
            if other is None:
                out.append(VersionChange(f"/{rel}", "removed", _kind(node), old_size=_size(node)))
            elif not _same(node, other):
                out.append(
                    VersionChange(
                        f"/{rel}",
                        "modified",
                        _kind(other),
                        old_size=_size(node),
                        new_size=_size(other),
                    )
                )
        out.extend(
            VersionChange(f"/{rel}", "added", _kind(node), new_size=_size(node))
            for rel, node in after.items()
            if rel not in before
        )
        out.sort(key=lambda c: c.path)
        return out


def _kind(node: Node) -> Literal["file", "dir"]:
    return "file" if isinstance(node, FileNode) else "dir"


def _size(node: Node) -> int:
    return len(node.data) if isinstance(node, FileNode) else 0


def _same(a: Node, b: Node) -> bool:
    if isinstance(a, FileNode) and isinstance(b, FileNode):
        return a is b or (a.data == b.data and a.mode == b.mode)
    return isinstance(a, DirNode) and isinstance(b, DirNode) and a.mode == b.mode
