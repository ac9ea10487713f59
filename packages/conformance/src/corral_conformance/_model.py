"""The reference file-system model: exactly the semantics fixed in ``corral._protocols``.

The model is synchronous and in-process. Where the contract is silent (which
error wins when two apply, whether a missing search root is an error or an
empty result) it raises :class:`ModelError`, whose ``alternatives`` list the
other codes a correct provider may report instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

import corral
import corral.provider
from corral import FileEntry, FileStat, GrepMatch, GrepResult, OperationError
from corral.capability import GrepOptions, Matcher

__all__ = ["FsModel", "ModelError", "Tree"]


class ModelError(OperationError):
    """An expected failure, with the other codes a provider may report instead.

    Args:
        message: What went wrong.
        code: The code the contract prescribes (or the most natural one).
        alternatives: Other acceptable codes where the contract is silent.
        empty_ok: A search may return an empty result instead of failing.
    """

    def __init__(
        self,
        message: str,
        *,
        code: corral.ErrorCode,
        alternatives: frozenset[str] = frozenset(),
        empty_ok: bool = False,
    ) -> None:
        super().__init__(message, code=code)
        self.alternatives = alternatives
        self.empty_ok = empty_ok

    @property
    def accepted(self) -> frozenset[str]:
        """Every code a correct provider may report."""
        return self.alternatives | {self.code}


Tree = dict[str, "Tree | bytes"]
"""A directory: names to sub-directories (dicts) or file contents (bytes)."""


def _parts(path: str) -> tuple[str, ...]:
    try:
        return corral.provider.path_parts(path)
    except OperationError as exc:
        raise ModelError(exc.message, code="invalid_path") from None


def _join(parts: tuple[str, ...]) -> str:
    return "/" + "/".join(parts)


@attrs.define
class FsModel:
    """A file tree with the contract's semantics; every method is synchronous.

    Attributes:
        root: The root directory.
    """

    root: Tree = attrs.field(factory=dict)

    def copy(self) -> FsModel:
        """An independent deep copy (a snapshot); iterative, as trees nest ~2000 deep."""
        root: Tree = dict(self.root)
        stack = [root]
        while stack:
            directory = stack.pop()
            for name, child in directory.items():
                if isinstance(child, dict):
                    directory[name] = twin = dict(child)
                    stack.append(twin)
        return FsModel(root)

    def _lookup(self, parts: tuple[str, ...]) -> Tree | bytes:
        node: Tree | bytes = self.root
        for idx, name in enumerate(parts):
            if isinstance(node, bytes):
                raise ModelError(
                    f"{_join(parts[:idx])} is not a directory",
                    code="not_a_directory",
                    alternatives=frozenset({"not_found"}),
                )
            if name not in node:
                raise ModelError(f"{_join(parts)} does not exist", code="not_found")
            node = node[name]
        return node

    def _dir(self, parts: tuple[str, ...]) -> Tree:
        node = self._lookup(parts)
        if isinstance(node, bytes):
            raise ModelError(f"{_join(parts)} is not a directory", code="not_a_directory")
        return node

    def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Content of a regular file; ``too_large`` past ``max_bytes``."""
        parts = _parts(path)
        node = self._lookup(parts)
        if not isinstance(node, bytes):
            raise ModelError(f"{_join(parts)} is a directory", code="is_a_directory")
        if max_bytes is not None and len(node) > max_bytes:
            raise ModelError(f"{_join(parts)} is over {max_bytes} bytes", code="too_large")
        return node

    def write_file(self, path: str, data: bytes) -> None:
        """Create or replace a file, creating parents."""
        parts = _parts(path)
        if not parts:
            raise ModelError(
                "the root is a directory",
                code="is_a_directory",
                alternatives=frozenset({"invalid_path", "invalid_argument"}),
            )
        node = self.root
        for idx, name in enumerate(parts[:-1]):
            child = node.setdefault(name, {})
            if isinstance(child, bytes):
                raise ModelError(
                    f"{_join(parts[: idx + 1])} is not a directory", code="not_a_directory"
                )
            node = child
        if isinstance(node.get(parts[-1]), dict):
            raise ModelError(f"{_join(parts)} is a directory", code="is_a_directory")
        node[parts[-1]] = bytes(data)

    def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        """Replace text in a UTF-8 file; return the count replaced."""
        parts = _parts(path)
        try:
            node = self._lookup(parts)
        except ModelError as exc:
            if old_text == "":
                raise ModelError(
                    "old_text is empty", code="invalid_argument", alternatives=exc.accepted
                ) from None
            raise
        if not isinstance(node, bytes):
            raise ModelError(
                f"{_join(parts)} is a directory",
                code="is_a_directory",
                alternatives=frozenset({"invalid_argument"}) if old_text == "" else frozenset(),
            )
        if old_text == "":
            raise ModelError("old_text is empty", code="invalid_argument")
        try:
            text = node.decode("utf-8")
        except UnicodeDecodeError:
            raise ModelError(
                f"{_join(parts)} is not UTF-8 text", code="unsupported_file_type"
            ) from None
        count = text.count(old_text)
        if count == 0:
            raise ModelError("old_text not found", code="no_match")
        if count > 1 and not replace_all:
            raise ModelError("old_text is not unique", code="not_unique")
        replaced = (
            text.replace(old_text, new_text) if replace_all else text.replace(old_text, new_text, 1)
        )
        self.write_file(path, replaced.encode("utf-8"))
        return count if replace_all else 1

    def ls(self, path: str = "/") -> list[FileEntry]:
        """Entries of a directory, sorted by name."""
        parts = _parts(path)
        node = self._lookup(parts)
        if isinstance(node, bytes):
            raise ModelError(f"{_join(parts)} is not a directory", code="not_a_directory")
        base = _join(parts)
        return [
            FileEntry(
                name=name,
                path=corral.provider.join_path(base, name),
                type="file" if isinstance(child, bytes) else "dir",
                size=len(child) if isinstance(child, bytes) else 0,
            )
            for name, child in sorted(node.items())
        ]

    def walk(self, parts: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Tree | bytes]]:
        """Every descendant of a directory (not the directory itself), depth first."""
        node = self._lookup(parts)
        if isinstance(node, bytes):
            return
        # Iterative (explicit stack of sorted listings): same order, any depth.
        stack = [(parts, sorted(node.items(), reverse=True))]
        while stack:
            prefix, pending = stack[-1]
            if not pending:
                stack.pop()
                continue
            name, child = pending.pop()
            yield (*prefix, name), child
            if isinstance(child, dict):
                stack.append(((*prefix, name), sorted(child.items(), reverse=True)))

    def glob(self, pattern: str, path: str = "/") -> list[str]:
        """Sorted agent paths under ``path`` whose relative path matches ``pattern``."""
        parts = _parts(path)
        try:
            node = self._lookup(parts)
        except ModelError as exc:
            raise ModelError(
                exc.message, code=exc.code, alternatives=exc.alternatives, empty_ok=True
            ) from None
        if isinstance(node, bytes):
            raise ModelError(
                f"{_join(parts)} is not a directory", code="not_a_directory", empty_ok=True
            )
        depth = len(parts)
        return sorted(
            _join(sub)
            for sub, _ in self.walk(parts)
            if corral.provider.glob_match(pattern, "/".join(sub[depth:]))
        )

    def _grep_files(self, options: GrepOptions) -> list[tuple[tuple[str, ...], bytes]]:
        parts = _parts(options.path)
        try:
            node = self._lookup(parts)
        except ModelError as exc:
            raise ModelError(
                exc.message, code=exc.code, alternatives=exc.alternatives, empty_ok=True
            ) from None
        if isinstance(node, bytes):
            candidates = [(parts, node)]
        else:
            candidates = [(p, n) for p, n in self.walk(parts) if isinstance(n, bytes)]
        if options.glob is None:
            return candidates
        depth = len(parts)
        keep = []
        for sub, data in candidates:
            subject = "/".join(sub[depth:]) if "/" in options.glob else sub[-1]
            if corral.provider.glob_match(options.glob, subject):
                keep.append((sub, data))
        return keep

    def grep_all(self, matcher: Matcher, options: GrepOptions) -> GrepResult:
        """Every match, ignoring ``max_results`` (the caller cuts the list)."""
        matches: list[GrepMatch] = []
        binary: list[str] = []
        for sub, data in self._grep_files(options):
            if corral.provider.is_binary(data):
                binary.append(_join(sub))
                continue
            text = data.decode("utf-8", errors="replace")
            for line_no, line in matcher.search_lines(text, len(text) + 1):
                matches.append(GrepMatch(path=_join(sub), line_number=line_no, line=line))
        matches.sort(key=lambda m: (m.path, m.line_number))
        return GrepResult(matches=tuple(matches), skipped_binary_paths=tuple(sorted(binary)))

    def grep(self, matcher: Matcher, options: GrepOptions) -> GrepResult:
        """Matches sorted by path then line, cut at ``max_results``.

        ``truncated`` is set exactly when more matching lines exist than
        ``max_results``; a ``max_results`` below 1 is ``invalid_argument``.
        """
        limit = options.max_results
        if limit < 1:
            raise ModelError("max_results must be at least 1", code="invalid_argument")
        full = self.grep_all(matcher, options)
        return attrs.evolve(full, matches=full.matches[:limit], truncated=len(full.matches) > limit)

    def stat(self, path: str) -> FileStat:
        """Metadata of a path."""
        parts = _parts(path)
        node = self._lookup(parts)
        if isinstance(node, bytes):
            return FileStat(path=_join(parts), type="file", size=len(node))
        return FileStat(path=_join(parts), type="dir", size=0)

    def mkdir(self, path: str, *, parents: bool = False) -> None:
        """Create a directory."""
        parts = _parts(path)
        node = self.root
        for idx, name in enumerate(parts):
            last = idx == len(parts) - 1
            child = node.get(name)
            if child is None:
                if not last and not parents:
                    raise ModelError(f"{_join(parts[: idx + 1])} does not exist", code="not_found")
                child = node[name] = {}
            elif isinstance(child, bytes):
                if last:
                    raise ModelError(f"{_join(parts)} already exists", code="exists")
                raise ModelError(
                    f"{_join(parts[: idx + 1])} is not a directory",
                    code="not_a_directory",
                    alternatives=frozenset({"not_found", "exists"}),
                )
            elif last and not parents:
                raise ModelError(f"{_join(parts)} already exists", code="exists")
            node = child
        if not parts and not parents:
            raise ModelError("the root already exists", code="exists")

    def rm(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file or directory."""
        parts = _parts(path)
        if not parts:
            raise ModelError("refusing to remove the workspace root", code="invalid_argument")
        node = self._lookup(parts)
        if isinstance(node, dict) and node and not recursive:
            raise ModelError(f"{_join(parts)} is not empty", code="not_empty")
        parent = self._dir(parts[:-1])
        del parent[parts[-1]]

    def dump(self) -> dict[str, bytes | None]:
        """Every path of the tree: file contents, or None for a directory."""
        return {_join(sub): (n if isinstance(n, bytes) else None) for sub, n in self.walk()}
