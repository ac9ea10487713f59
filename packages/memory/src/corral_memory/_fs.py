"""The in-memory FileSystem module.

Every method checkpoints once on entry and then runs its whole operation
synchronously under the workspace lock, so operations are atomic with
respect to each other: nothing awaits between reading the tree and mutating
it. ``glob`` and ``grep`` collect their view of the tree in one such step
and only then do the slow part (matching), checkpointing as they go.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import anyio.lowlevel

from corral.provider import (
    FileEntry,
    FileStat,
    GrepOptions,
    GrepResult,
    Matcher,
    OperationError,
    apply_edit,
    normalize_path,
    path_parts,
    workspace_closed,
)

from ._search import glob_tree, grep_tree
from ._store import WorkspaceState
from ._tree import FILE_MODE, DirNode, FileNode, Node, Tree, display, entry_cost, subtree_cost

__all__ = ["InMemoryFileSystem"]


def _is_a_directory(parts: tuple[str, ...]) -> OperationError:
    return OperationError(f"{display(parts)}: is a directory", code="is_a_directory")


def _reserve(state: WorkspaceState, tree: Tree, cost: int) -> None:
    budget = state.limits.max_workspace_bytes
    if cost > 0 and tree.used_bytes + cost > budget:
        raise OperationError(
            f"the workspace would exceed its {budget} byte budget "
            f"(file contents plus per-entry overhead; {tree.used_bytes} in use)",
            code="too_large",
        )


def _check_file_size(state: WorkspaceState, size: int) -> None:
    cap = state.limits.max_file_bytes
    if size > cap:
        raise OperationError(
            f"file of {size} bytes exceeds the {cap} byte file size limit", code="too_large"
        )


def _stat_of(path: str, node: Node) -> FileStat:
    if isinstance(node, FileNode):
        size = len(node.data)
        return FileStat(path=path, type="file", size=size, mtime=node.mtime, mode=node.mode)
    return FileStat(path=path, type="dir", size=0, mtime=node.mtime, mode=node.mode)


class InMemoryFileSystem:
    """Files of one in-memory workspace (see :class:`corral.provider.FileSystem`).

    Args:
        state: The workspace's state in the process-wide store.
    """

    def __init__(self, state: WorkspaceState) -> None:
        self._state = state

    async def _enter(self) -> WorkspaceState:
        await anyio.lowlevel.checkpoint()
        if self._state.closed:
            raise workspace_closed()
        return self._state

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Return the whole content of a regular file (at most ``max_bytes``)."""
        parts = path_parts(path)
        state = await self._enter()
        with state.lock:
            node = state.tree.lookup(parts)
        if isinstance(node, DirNode):
            raise _is_a_directory(parts)
        if max_bytes is not None and len(node.data) > max_bytes:
            raise OperationError(
                f"file of {len(node.data)} bytes exceeds the {max_bytes} byte read limit",
                code="too_large",
            )
        return node.data

    async def write_file(self, path: str, data: bytes) -> None:
        """Create or replace a file atomically, creating missing parents."""
        parts = path_parts(path)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise OperationError("data must be bytes", code="invalid_argument")
        payload = bytes(data)
        if not parts:
            raise _is_a_directory(parts)
        state = await self._enter()
        _check_file_size(state, len(payload))
        with state.lock:
            self._put(state, parts, payload)

    def _put(self, state: WorkspaceState, parts: tuple[str, ...], data: bytes) -> None:
        tree = state.tree
        parent, depth = tree.existing_prefix(parts[:-1])
        missing = parts[depth:-1]
        leaf = parts[-1]
        old = parent.children.get(leaf) if not missing else None
        if isinstance(old, DirNode):
            raise _is_a_directory(parts)
        new_node = FileNode(data, time.time(), old.mode if old is not None else FILE_MODE)
        cost = sum(entry_cost(name, DirNode({}, 0.0)) for name in missing)
        cost += entry_cost(leaf, new_node) - (entry_cost(leaf, old) if old is not None else 0)
        _reserve(state, tree, cost)
        now = new_node.mtime
        for name in missing:
            child = DirNode({}, now)
            parent.children[name] = child
            parent.mtime = now
            parent = child
        if old is None:
            parent.mtime = now
        parent.children[leaf] = new_node
        tree.used_bytes += cost
        tree.file_bytes += len(data) - (len(old.data) if old is not None else 0)

    async def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        """Replace ``old_text`` with ``new_text`` in a UTF-8 file; return the count."""
        parts = path_parts(path)
        if not isinstance(old_text, str) or not isinstance(new_text, str):
            raise OperationError("old_text and new_text must be strings", code="invalid_argument")
        if not old_text:
            raise OperationError("old_text must not be empty", code="invalid_argument")
        state = await self._enter()
        with state.lock:
            node = state.tree.lookup(parts)
            if isinstance(node, DirNode):
                raise _is_a_directory(parts)
            data, count = apply_edit(
                node.data, old_text, new_text, replace_all=replace_all, where=display(parts)
            )
            _check_file_size(state, len(data))
            self._put(state, parts, data)
        return count

    async def ls(self, path: str = "/") -> Sequence[FileEntry]:
        """List a directory, sorted by name; directories report size 0."""
        parts = path_parts(path)
        state = await self._enter()
        with state.lock:
            directory = state.tree.lookup_dir(parts)
            items = sorted(directory.children.items())
        base = display(parts)
        prefix = "" if base == "/" else base
        return [
            FileEntry(
                name=name,
                path=f"{prefix}/{name}",
                type="file" if isinstance(node, FileNode) else "dir",
                size=len(node.data) if isinstance(node, FileNode) else 0,
            )
            for name, node in items
        ]

    async def glob(self, pattern: str, path: str = "/") -> Sequence[str]:
        """Sorted paths under ``path`` whose relative path matches ``pattern``."""
        state = await self._enter()
        return await glob_tree(state, pattern, path)

    async def grep(self, matcher: Matcher, options: GrepOptions) -> GrepResult:
        """Search regular files line by line with a compiled matcher."""
        state = await self._enter()
        return await grep_tree(state, matcher, options)

    async def stat(self, path: str) -> FileStat:
        """Describe a path (type, size, mtime, permission bits)."""
        parts = path_parts(path)
        state = await self._enter()
        with state.lock:
            node = state.tree.lookup(parts)
        return _stat_of(normalize_path(path), node)

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        """Create a directory (and, with ``parents``, its missing ancestors)."""
        parts = path_parts(path)
        state = await self._enter()
        if not parts:
            if parents:
                return
            raise OperationError("/: already exists", code="exists")
        with state.lock:
            tree = state.tree
            parent, depth = tree.existing_prefix(parts[:-1])
            missing = parts[depth:]
            if depth < len(parts) - 1:
                if not parents:
                    raise OperationError(
                        f"{display(parts[: depth + 1])}: no such file or directory",
                        code="not_found",
                    )
            else:
                existing = parent.children.get(parts[-1])
                if existing is not None:
                    if parents and isinstance(existing, DirNode):
                        return
                    raise OperationError(f"{display(parts)}: already exists", code="exists")
            cost = sum(entry_cost(name, DirNode({}, 0.0)) for name in missing)
            _reserve(state, tree, cost)
            now = time.time()
            for name in missing:
                child = DirNode({}, now)
                parent.children[name] = child
                parent.mtime = now
                parent = child
            tree.used_bytes += cost

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file or directory; a non-empty directory needs ``recursive``."""
        parts = path_parts(path)
        if not parts:
            raise OperationError("refusing to remove the workspace root", code="invalid_argument")
        state = await self._enter()
        with state.lock:
            tree = state.tree
            parent = tree.lookup_dir(parts[:-1])
            node = parent.children.get(parts[-1])
            if node is None:
                raise OperationError(
                    f"{display(parts)}: no such file or directory", code="not_found"
                )
            if isinstance(node, DirNode) and node.children and not recursive:
                raise OperationError(f"{display(parts)}: directory not empty", code="not_empty")
            used, files = subtree_cost(parts[-1], node)
            del parent.children[parts[-1]]
            parent.mtime = time.time()
            tree.used_bytes -= used
            tree.file_bytes -= files
