"""glob and grep over the in-memory tree.

Both take their view of the tree in one synchronous step under the lock (a
list of paths and immutable file nodes, so a concurrent write cannot change
what is being searched), then match with periodic checkpoints so a search
over many files lets other tasks run.
"""

from __future__ import annotations

from typing import Final

import anyio.lowlevel

from corral.provider import (
    BINARY_SNIFF_BYTES,
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

from ._store import WorkspaceState
from ._tree import DirNode, FileNode, display, walk

__all__ = ["glob_tree", "grep_tree"]

_MAX_PATTERN_LENGTH: Final = 4096
_GLOB_BATCH: Final = 2048
_GREP_BATCH_BYTES: Final = 256 * 1024


def _check_pattern(pattern: object, what: str) -> str:
    if not isinstance(pattern, str) or not pattern:
        raise OperationError(f"{what} must be a non-empty string", code="invalid_argument")
    if "\x00" in pattern or len(pattern) > _MAX_PATTERN_LENGTH:
        raise OperationError(
            f"{what} holds a NUL byte or is longer than {_MAX_PATTERN_LENGTH} characters",
            code="invalid_argument",
        )
    return pattern


async def glob_tree(state: WorkspaceState, pattern: str, path: str) -> list[str]:
    """Sorted agent-view paths under ``path`` whose relative path matches."""
    pattern = _check_pattern(pattern, "glob pattern")
    parts = path_parts(path)
    with state.lock:
        relpaths = [rel for rel, _node in walk(state.tree.lookup_dir(parts))]
    base = display(parts)
    found: list[str] = []
    for idx, rel in enumerate(relpaths):
        if glob_match(pattern, rel):
            found.append(join_path(base, rel))
        if idx % _GLOB_BATCH == _GLOB_BATCH - 1:
            await anyio.lowlevel.checkpoint()
    found.sort()
    return found


def _check_options(options: GrepOptions) -> None:
    if not isinstance(options, GrepOptions):
        raise OperationError("grep options must be a GrepOptions", code="invalid_argument")
    limit = options.max_results
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise OperationError("max_results must be a positive integer", code="invalid_argument")
    if options.glob is not None:
        _check_pattern(options.glob, "glob")


async def grep_tree(state: WorkspaceState, matcher: Matcher, options: GrepOptions) -> GrepResult:
    """Search the regular files under ``options.path`` (or that one file)."""
    _check_options(options)
    parts = path_parts(options.path)
    with state.lock:
        top = state.tree.lookup(parts)
        if isinstance(top, FileNode):
            files = [(display(parts), parts[-1] if parts else "", top)]
        else:
            base = display(parts)
            files = [
                (join_path(base, rel), rel, node)
                for rel, node in walk(top)
                if not isinstance(node, DirNode)
            ]
    files.sort(key=lambda item: item[0])
    glob = options.glob
    glob_on_relpath = glob is not None and "/" in glob
    cap = state.limits.max_grep_file_bytes
    limit = options.max_results
    matches: list[GrepMatch] = []
    skipped: list[str] = []
    skipped_binary: list[str] = []
    truncated = False
    since_checkpoint = 0
    search = bytes_searcher(matcher)
    for abspath, rel, node in files:
        if glob is not None:
            target = rel if glob_on_relpath else rel.rpartition("/")[2]
            if not glob_match(glob, target):
                continue
        data = node.data
        if len(data) > cap:
            skipped.append(abspath)
            continue
        if data.find(b"\x00", 0, BINARY_SNIFF_BYTES) >= 0:
            skipped_binary.append(abspath)
            continue
        # One more than fits tells an exactly-full result from a cut one.
        room = limit - len(matches)
        hits = search(data, room + 1)
        matches.extend(GrepMatch(abspath, line_no, line) for line_no, line in hits[:room])
        if len(hits) > room:
            truncated = True
            break
        since_checkpoint += len(data) + 512
        if since_checkpoint >= _GREP_BATCH_BYTES:
            since_checkpoint = 0
            await anyio.lowlevel.checkpoint()
    return GrepResult(
        matches=tuple(matches),
        skipped_paths=tuple(skipped),
        skipped_binary_paths=tuple(skipped_binary),
        truncated=truncated,
    )
