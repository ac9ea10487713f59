"""Directory walks beneath a root fd: ls, glob and grep.

Walks descend through directory fds opened ``O_NOFOLLOW | O_DIRECTORY``
relative to their parent, so a symlink is listed but never entered, and a
directory swapped for a symlink mid-walk is skipped. Depth and entry count
are capped; a directory seen twice on the current path (a bind-mount loop)
is not entered again. Entries are visited in the order of their full paths
(a directory sorts as ``name/``), so grep's matches come out sorted and its
``max_results`` cut is the first N in that order.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Generator, Sequence
from typing import Final

import attrs

from corral.provider import (
    BINARY_SNIFF_BYTES,
    FileEntry,
    GrepMatch,
    GrepOptions,
    GrepResult,
    Matcher,
    OperationError,
    bytes_searcher,
    glob_match,
    join_path,
    path_parts,
)

from ._fdtree import DirChain
from ._fileops import READ_FLAGS, FsConfig, file_type, oserror, read_regular, where
from ._resolve import open_beneath

__all__ = ["glob_paths", "grep_tree", "list_dir"]

_LIST_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_SUBDIR_FLAGS: Final = _LIST_FLAGS | os.O_NOFOLLOW
_MAGIC: Final = frozenset("*?[")


@attrs.define
class _Budget:
    entries_left: int
    max_depth: int
    skipped: list[str] = attrs.Factory(list)
    depth_cut: list[str] = attrs.Factory(list)
    exhausted: bool = False


@attrs.frozen
class _Entry:
    dir_fd: int
    name: str
    rel: str
    is_dir: bool
    is_file: bool


def _open_base(root_fd: int, parts: Sequence[str], cfg: FsConfig) -> int:
    return open_beneath(
        root_fd, parts, _LIST_FLAGS, resolver=cfg.resolver, follow_leaf=cfg.allow_leaf_symlinks
    )


def list_dir(root_fd: int, parts: Sequence[str], cfg: FsConfig) -> list[FileEntry]:
    """``ls``: entries of one directory, sorted by name, symlinks not followed."""
    fd = _open_base(root_fd, parts, cfg)
    base = where(parts)
    try:
        out: list[FileEntry] = []
        with os.scandir(fd) as it:
            for entry in it:
                if len(out) >= cfg.max_walk_entries:
                    raise OperationError(
                        f"{base} has more than {cfg.max_walk_entries} entries; "
                        "use glob to narrow the listing",
                        code="too_large",
                    )
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed while we listed
                kind = file_type(st.st_mode)
                out.append(
                    FileEntry(
                        name=entry.name,
                        path=join_path(base, entry.name),
                        type=kind,
                        size=st.st_size if kind == "file" else 0,
                    )
                )
    except OSError as exc:
        raise oserror(exc, parts, "list") from None
    finally:
        os.close(fd)
    out.sort(key=lambda e: e.name)
    return out


@attrs.define
class _Level:
    """One directory of the walk's current path: its sorted listing and how far we are."""

    prefix: str
    raw: list[tuple[str, bool, bool]]
    index: int = 0


def _listing(dir_fd: int) -> list[tuple[str, bool, bool]] | None:
    try:
        with os.scandir(dir_fd) as it:
            raw = [
                (e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
                for e in it
            ]
    except OSError:
        return None
    raw.sort(key=lambda r: r[0] + "/" if r[1] else r[0])
    return raw


def _tree(fd: int, budget: _Budget) -> Generator[_Entry, None, None]:
    """Yield the entries under ``fd`` depth-first in full-path order.

    Iterative, with one directory fd open below ``fd`` whatever the depth
    (see :class:`DirChain`): an entry's ``dir_fd`` is valid until the next
    entry is requested.
    """
    if budget.max_depth <= 0:
        return
    raw = _listing(fd)
    if raw is None:
        budget.skipped.append(".")
        return
    chain = DirChain(fd)
    levels = [_Level("", raw)]
    try:
        while levels:
            level = levels[-1]
            if level.index >= len(level.raw):
                levels.pop()
                if levels:
                    chain.ascend()
                continue
            if budget.entries_left <= 0:
                budget.exhausted = True
                budget.skipped.append(level.prefix or ".")
                budget.skipped.extend(
                    up.prefix or "." for up in reversed(levels[:-1]) if up.index < len(up.raw)
                )
                return
            name, is_dir, is_file = level.raw[level.index]
            level.index += 1
            budget.entries_left -= 1
            rel = f"{level.prefix}/{name}" if level.prefix else name
            yield _Entry(chain.fd, name, rel, is_dir, is_file)
            if not is_dir:
                continue
            if len(levels) >= budget.max_depth:
                budget.depth_cut.append(rel)
                continue
            try:
                outcome = chain.descend(name)
            except OSError:
                budget.skipped.append(rel)
                continue
            if outcome == "loop":
                budget.skipped.append(rel)
            if outcome != "entered":
                continue  # gone, or swapped for a symlink or file since the listing
            sub = _listing(chain.fd)
            if sub is None:
                budget.skipped.append(rel)
                sub = []
            levels.append(_Level(rel, sub))
    finally:
        chain.close()


def glob_paths(root_fd: int, parts: Sequence[str], pattern: str, cfg: FsConfig) -> list[str]:
    """``glob``: entries under ``parts`` whose relative path matches ``pattern``."""
    comps = [c for c in pattern.split("/") if c not in ("", ".")]
    if not comps:
        return []
    # Leading literal components are opened directly instead of walked.
    literal: list[str] = []
    while len(literal) < len(comps) - 1:
        comp = comps[len(literal)]
        if comp in ("..", "**") or _MAGIC & set(comp):
            break
        literal.append(comp)
    rest = comps[len(literal) :]
    depth = cfg.max_walk_depth if "**" in rest else min(len(rest), cfg.max_walk_depth)
    fd = _open_base(root_fd, parts, cfg)
    try:
        for comp in literal:
            try:
                sub = os.open(comp, _SUBDIR_FLAGS, dir_fd=fd)
            except OSError:
                return []  # missing, a file, or a symlink: walks never follow links
            os.close(fd)
            fd = sub
        budget = _Budget(cfg.max_walk_entries, depth)
        rest_pattern = "/".join(rest)
        hits = [e.rel for e in _tree(fd, budget) if glob_match(rest_pattern, e.rel)]
    finally:
        os.close(fd)
    if budget.exhausted:
        raise OperationError(
            f"glob visited more than {cfg.max_walk_entries} entries; narrow the pattern or path",
            code="too_large",
        )
    if budget.depth_cut and "**" in rest:
        raise OperationError(
            f"glob reached the depth limit of {cfg.max_walk_depth} directories; "
            "narrow the pattern or path",
            code="too_large",
        )
    base = where((*parts, *literal))
    return sorted(join_path(base, rel) for rel in hits)


def grep_tree(root_fd: int, matcher: Matcher, options: GrepOptions, cfg: FsConfig) -> GrepResult:
    """``grep``: search regular files under ``options.path`` with ``matcher``."""
    if options.max_results < 1:
        raise OperationError("max_results must be at least 1", code="invalid_argument")
    parts = path_parts(options.path)
    base = where(parts)
    fd = open_beneath(
        root_fd, parts, READ_FLAGS, resolver=cfg.resolver, follow_leaf=cfg.allow_leaf_symlinks
    )
    state = _GrepState(matcher, options, cfg)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            budget = _Budget(cfg.max_walk_entries, cfg.max_walk_depth)
            with contextlib.closing(_tree(fd, budget)) as entries:
                for entry in entries:
                    if entry.is_file and state.wanted(entry):
                        state.search_at(entry.dir_fd, entry.name, join_path(base, entry.rel))
                        if state.truncated:
                            break
            cut = [*budget.skipped, *budget.depth_cut]
            state.skipped.extend(join_path(base, rel) if rel != "." else base for rel in cut)
        elif parts and state.wanted_name(parts[-1], parts[-1]):
            state.search_fd(fd, base, parts)
    except OSError as exc:
        raise oserror(exc, parts, "search") from None
    finally:
        os.close(fd)
    return GrepResult(
        matches=tuple(state.matches),
        skipped_paths=tuple(sorted(state.skipped)),
        skipped_binary_paths=tuple(sorted(state.binary)),
        truncated=state.truncated,
    )


class _GrepState:
    def __init__(self, matcher: Matcher, options: GrepOptions, cfg: FsConfig) -> None:
        self.search = bytes_searcher(matcher)
        self.glob = options.glob
        self.max_results = options.max_results
        self.max_bytes = cfg.max_file_bytes
        self.matches: list[GrepMatch] = []
        self.skipped: list[str] = []
        self.binary: list[str] = []
        self.truncated = False

    def wanted(self, entry: _Entry) -> bool:
        return self.wanted_name(entry.name, entry.rel)

    def wanted_name(self, name: str, rel: str) -> bool:
        if self.glob is None:
            return True
        return glob_match(self.glob, rel if "/" in self.glob else name)

    def search_at(self, dir_fd: int, name: str, path: str) -> None:
        try:
            fd = os.open(name, READ_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError:
            self.skipped.append(path)
            return
        try:
            data = _read_capped(fd, self.max_bytes)
        except OSError:
            data = None
        finally:
            os.close(fd)
        if data is None:
            self.skipped.append(path)
        else:
            self.search_data(data, path)

    def search_fd(self, fd: int, path: str, parts: Sequence[str]) -> None:
        try:
            data = read_regular(fd, parts, self.max_bytes)
        except OperationError:
            self.skipped.append(path)
            return
        self.search_data(data, path)

    def search_data(self, data: bytes, path: str) -> None:
        if data.find(b"\x00", 0, BINARY_SNIFF_BYTES) >= 0:
            self.binary.append(path)
            return
        room = self.max_results - len(self.matches)
        found = self.search(data, room + 1)
        if len(found) > room:
            self.truncated = True
            found = found[:room]
        self.matches.extend(GrepMatch(path, line_no, line) for line_no, line in found)


def _read_capped(fd: int, max_bytes: int) -> bytes | None:
    """:func:`read_regular` for the walk: ``None`` instead of an error to word.

    The same checks in the same order (fstat first, so a FIFO is never read;
    the cap before any byte), but no path is built for a message nobody sees.
    """
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
        return None
    want = st.st_size + 1
    data = os.read(fd, want)
    if len(data) < want:
        return data  # a short read of a regular file is its end
    chunks = [data]
    total = len(data)
    # The file grew after the fstat; keep reading to EOF but never past the cap.
    while chunks[-1]:
        if total > max_bytes:
            return None
        chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
        total += len(chunk)
        chunks.append(chunk)
    return b"".join(chunks)
