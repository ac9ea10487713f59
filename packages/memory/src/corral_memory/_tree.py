"""The in-memory file tree: directory nodes with children, immutable file nodes.

File nodes are frozen and hold immutable ``bytes``, so a copy of the tree
only duplicates directory nodes and shares every file: snapshots cost one
dict per directory, not a copy of the data. Every walk is iterative because a
4096-byte path can nest about 2000 directories, deeper than Python's
recursion limit.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import attrs

from corral.provider import OperationError

__all__ = [
    "DIR_MODE",
    "ENTRY_OVERHEAD",
    "FILE_MODE",
    "DirNode",
    "FileNode",
    "Node",
    "Tree",
    "display",
    "entry_cost",
    "subtree_cost",
    "walk",
]

ENTRY_OVERHEAD: Final = 256
"""Bytes charged per file or directory on top of its name and content.

Roughly what the node, its dict slot and its name string cost in CPython, so
the byte budget also bounds how many (possibly empty) entries a workspace
can hold.
"""

FILE_MODE: Final = 0o644
DIR_MODE: Final = 0o755


@attrs.frozen(slots=True)
class FileNode:
    """A regular file; replaced, never mutated, so trees can share it."""

    data: bytes
    mtime: float
    mode: int = FILE_MODE


@attrs.define(slots=True, eq=False)
class DirNode:
    """A directory; its children map names to nodes.

    ``children`` stays out of ``repr``: a generated repr recurses once per
    level, and the agent decides how deep a tree is.
    """

    children: dict[str, Node] = attrs.field(repr=False)
    mtime: float
    mode: int = DIR_MODE


Node = FileNode | DirNode


def entry_cost(name: str, node: Node) -> int:
    """What one entry (not its descendants) charges against the budget."""
    size = len(node.data) if isinstance(node, FileNode) else 0
    return ENTRY_OVERHEAD + len(name.encode("utf-8")) + size


def display(parts: tuple[str, ...]) -> str:
    """The agent-view path of some components."""
    return "/" + "/".join(parts)


def _not_found(parts: tuple[str, ...]) -> OperationError:
    return OperationError(f"{display(parts)}: no such file or directory", code="not_found")


def _not_a_dir(parts: tuple[str, ...]) -> OperationError:
    return OperationError(f"{display(parts)}: not a directory", code="not_a_directory")


@attrs.define(slots=True, eq=False)
class Tree:
    """A root directory plus the byte counters the budget checks.

    Attributes:
        root: The workspace root directory.
        used_bytes: Charged bytes of every entry (see :func:`entry_cost`).
        file_bytes: Total size of file contents.
    """

    root: DirNode
    used_bytes: int = 0
    file_bytes: int = 0

    @classmethod
    def empty(cls, now: float) -> Tree:
        """A tree holding only an empty root."""
        return cls(DirNode({}, now))

    def lookup(self, parts: tuple[str, ...]) -> Node:
        """The node at ``parts``.

        Raises:
            OperationError: ``not_found`` for a missing component,
                ``not_a_directory`` when a file stands where a directory should.
        """
        node: Node = self.root
        for idx, name in enumerate(parts):
            if not isinstance(node, DirNode):
                raise _not_a_dir(parts[:idx])
            child = node.children.get(name)
            if child is None:
                raise _not_found(parts[: idx + 1])
            node = child
        return node

    def lookup_dir(self, parts: tuple[str, ...]) -> DirNode:
        """The directory at ``parts``; a file there is ``not_a_directory``."""
        node = self.lookup(parts)
        if not isinstance(node, DirNode):
            raise _not_a_dir(parts)
        return node

    def existing_prefix(self, parts: tuple[str, ...]) -> tuple[DirNode, int]:
        """Walk the directories of ``parts`` that exist.

        Returns:
            The deepest existing directory and how many components it covers;
            the rest of ``parts`` is missing.

        Raises:
            OperationError: ``not_a_directory`` when a component is a file.
        """
        node = self.root
        for idx, name in enumerate(parts):
            child = node.children.get(name)
            if child is None:
                return node, idx
            if not isinstance(child, DirNode):
                raise _not_a_dir(parts[: idx + 1])
            node = child
        return node, len(parts)

    def copy(self) -> Tree:
        """A structural copy: new directory nodes, shared (immutable) files."""
        root = DirNode(dict(self.root.children), self.root.mtime, self.root.mode)
        stack = [root]
        while stack:
            directory = stack.pop()
            for name, child in list(directory.children.items()):
                if isinstance(child, DirNode):
                    twin = DirNode(dict(child.children), child.mtime, child.mode)
                    directory.children[name] = twin
                    stack.append(twin)
        return Tree(root, self.used_bytes, self.file_bytes)


def walk(top: DirNode) -> Iterator[tuple[str, Node]]:
    """Every entry under ``top`` as ``(relative path, node)``, parents first."""
    stack: list[tuple[str, DirNode]] = [("", top)]
    while stack:
        prefix, directory = stack.pop()
        for name, child in directory.children.items():
            rel = f"{prefix}{name}"
            yield rel, child
            if isinstance(child, DirNode):
                stack.append((rel + "/", child))


def subtree_cost(name: str, node: Node) -> tuple[int, int]:
    """Charged bytes and file bytes of an entry and everything under it."""
    used = entry_cost(name, node)
    files = len(node.data) if isinstance(node, FileNode) else 0
    if isinstance(node, DirNode):
        for rel, child in walk(node):
            used += entry_cost(rel.rpartition("/")[2], child)
            if isinstance(child, FileNode):
                files += len(child.data)
    return used, files
