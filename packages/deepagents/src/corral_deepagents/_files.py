"""deepagents' file operations on a corral workspace's ``fs`` module (async, on its loop).

Each function takes the open ``WorkspaceSession`` and returns deepagents'
result type; a failure is an error in that result, never an exception.
Error messages name the path only in its canonical form under the mount path
(never the caller's raw input) and never quote file contents or patterns.
"""

from __future__ import annotations

import base64
from typing import Final

import attrs
from deepagents.backends.protocol import (
    EditResult,
    FileData,
    FileDownloadResponse,
    FileInfo,
    FileUploadResponse,
    GlobResult,
    GrepMatch,
    GrepResult,
    LsResult,
    ReadResult,
    WriteResult,
)
from deepagents.backends.sandbox import MAX_BINARY_BYTES, MAX_OUTPUT_BYTES, TRUNCATION_MSG
from deepagents.backends.utils import (
    EMPTY_CONTENT_WARNING,
    EMPTY_OLD_STRING_ERROR,
    InvalidGlobPatternError,
    compile_grep_include_glob,
    normalize_read_bounds,
)

import corral
import corral.capability
import corral.provider

from ._paths import PathRefusedError, WorkspacePaths

__all__ = [
    "MAX_GLOB_MATCHES",
    "MAX_GREP_MATCHES",
    "Files",
    "LiteralMatcher",
]

MAX_GLOB_MATCHES: Final = 10_000
"""Most files one ``glob`` returns (deepagents' sandbox cap); more sets ``truncated``."""

MAX_GREP_MATCHES: Final = 10_000
"""Most matching lines one ``grep`` returns without ``max_count``; more sets ``truncated``."""

# corral's error codes, as deepagents' FileOperationError literals.
_TRANSFER_ERRORS: Final = {
    "not_found": "file_not_found",
    "is_a_directory": "is_directory",
    "permission_denied": "permission_denied",
    "invalid_path": "invalid_path",
    "not_a_directory": "invalid_path",
}

_READ_ONLY: Final = "the workspace's files are read-only (fs read_only policy)"


@attrs.frozen
class LiteralMatcher:
    """A ``corral.capability.Matcher`` for a literal string: deepagents' grep is never a regex.

    Plain substring search, linear in the text, so no pattern can be slow.

    Attributes:
        pattern: The literal text.
    """

    pattern: str

    def search_lines(self, text: str, limit: int) -> list[tuple[int, str]]:
        """Up to ``limit`` ``(line_number, line)`` pairs of lines holding the text."""
        found: list[tuple[int, str]] = []
        pos, line_no, counted_to = 0, 1, 0
        while len(found) < limit:
            start = text.find(self.pattern, pos)
            if start < 0 or not self.pattern:
                break
            line_start = text.rfind("\n", 0, start) + 1
            line_end = text.find("\n", start + max(len(self.pattern) - 1, 0))
            line_end = len(text) if line_end < 0 else line_end
            line_no += text.count("\n", counted_to, line_start)
            counted_to = line_start
            found.append((line_no, text[line_start:line_end].removesuffix("\r")))
            pos = line_end + 1
        return found


def _split_lines(text: str) -> list[str]:
    """Lines as deepagents' sandbox reads them: universal newlines, no terminators."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _page(lines: list[str], offset: int, limit: int) -> tuple[str, int, bool]:
    """The window's text capped at deepagents' output size: (text, whole lines, cut)."""
    budget = MAX_OUTPUT_BYTES - len(TRUNCATION_MSG.encode("utf-8"))
    parts: list[str] = []
    used = returned = 0
    for line in lines[offset : offset + limit]:
        piece = line if returned == 0 else "\n" + line
        size = len(piece.encode("utf-8"))
        if used + size > budget:
            head = piece.encode("utf-8")[: budget - used].decode("utf-8", errors="ignore")
            parts.append(head)
            # A cut line is not counted, so the next page starts with it whole;
            # a first line over the budget still advances by one.
            return "".join(parts) + TRUNCATION_MSG, max(returned, 1), True
        parts.append(piece)
        used += size
        returned += 1
    return "".join(parts), returned, False


class Files:
    """The file half of the backend, bound to one session.

    Args:
        session: The open session (its workspace must declare ``fs``).
        max_file_bytes: The largest file read, downloaded, written or uploaded.
    """

    def __init__(self, session: corral.WorkspaceSession, *, max_file_bytes: int) -> None:
        self._session = session
        self._max = max_file_bytes

    async def _open(self) -> tuple[corral.provider.FileSystem, WorkspacePaths]:
        ws = await self._session.workspace()
        return ws.require("fs"), WorkspacePaths.of(ws.details())

    def _offers(self, tool: str) -> bool:
        """Whether the session's policy offers a tool (``fs.read_only`` withholds mutating ones)."""
        return any(t.name == tool for t in self._session.tools)

    async def read(self, file_path: str, offset: int, limit: int) -> ReadResult:
        """deepagents' ``read``: a page of a text file, or a small binary file as base64."""
        try:
            fs, paths = await self._open()
            path = paths.to_workspace(file_path)
            shown = paths.show(path)
            raw = await fs.read_file(path, max_bytes=self._max)
        except (PathRefusedError, corral.WorkspaceError, corral.OperationError) as exc:
            return ReadResult(error=_message(exc, file_path))
        offset, limit = normalize_read_bounds(offset, limit)
        if not raw:
            return ReadResult(file_data=FileData(content=EMPTY_CONTENT_WARNING, encoding="utf-8"))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            if len(raw) > MAX_BINARY_BYTES:
                return ReadResult(
                    error=f"File '{shown}': Binary file exceeds maximum preview size of "
                    f"{MAX_BINARY_BYTES} bytes"
                )
            encoded = base64.b64encode(raw).decode("ascii")
            return ReadResult(file_data=FileData(content=encoded, encoding="base64"))
        if limit == 0:
            return ReadResult(
                file_data=FileData(content="", encoding="utf-8"), no_lines_requested=True
            )
        lines = _split_lines(text)
        if offset >= len(lines):
            return ReadResult(
                error=f"Line offset {offset} exceeds file length ({len(lines)} lines)"
            )
        content, returned, _ = _page(lines, offset, limit)
        end = offset + returned
        return ReadResult(
            file_data=FileData(content=content, encoding="utf-8"),
            total_lines=len(lines),
            start_line=offset + 1,
            end_line=end,
            next_offset=end if end < len(lines) else None,
        )

    async def write(self, file_path: str, content: str) -> WriteResult:
        """deepagents' ``write``: create or replace a text file (parents created)."""
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:
            return WriteResult(error="Error: the content is not valid Unicode (a lone surrogate)")
        failure = await self._upload(file_path, data)
        if failure is not None:
            return WriteResult(error=f"Failed to write file: {failure[1]}")
        return WriteResult(path=file_path)

    async def edit(
        self, file_path: str, old_string: str, new_string: str, replace_all: bool
    ) -> EditResult:
        """deepagents' ``edit``: exact replacement, unique unless ``replace_all``."""
        if not old_string:
            return EditResult(error=EMPTY_OLD_STRING_ERROR)
        if old_string == new_string:
            return EditResult(error="Error: old_string and new_string are identical")
        if not self._offers("workspace_edit_file"):
            return EditResult(error=f"Error: {_READ_ONLY}")
        try:
            fs, paths = await self._open()
            path = paths.to_workspace(file_path)
            shown = paths.show(path)
            count = await fs.edit_file(path, old_string, new_string, replace_all=replace_all)
        except corral.OperationError as exc:
            if exc.code == "no_match":
                return EditResult(error="Error: String not found in file")
            if exc.code == "not_unique":
                return EditResult(
                    error="Error: String appears multiple times in file. Use replace_all=True "
                    "to replace all instances, or provide a more specific string with "
                    "surrounding context."
                )
            return EditResult(error=_message(exc, file_path))
        except (PathRefusedError, corral.WorkspaceError) as exc:
            return EditResult(error=_message(exc, file_path))
        return EditResult(path=shown, occurrences=count)

    async def ls(self, path: str) -> LsResult:
        """deepagents' ``ls``: a directory's entries with absolute paths."""
        try:
            fs, paths = await self._open()
            where = paths.to_workspace(path)
            entries = await fs.ls(where)
        except (PathRefusedError, corral.WorkspaceError, corral.OperationError) as exc:
            return LsResult(error=_message(exc, path))
        infos: list[FileInfo] = [
            {"path": paths.show(e.path), "is_dir": e.type == "dir", "size": e.size} for e in entries
        ]
        return LsResult(entries=infos)

    async def _under(
        self, fs: corral.provider.FileSystem, root: str, pattern: str
    ) -> tuple[list[tuple[str, int]], bool]:
        """Regular files under ``root`` matching an include glob: (path, size), truncated."""
        included = compile_grep_include_glob(pattern)
        prefix = "" if root == "/" else root
        found: list[tuple[str, int]] = []
        for candidate in await fs.glob("**", root):
            if not included(candidate[len(prefix) :].lstrip("/")):
                continue
            st = await fs.stat(candidate)
            if st.type == "file":
                if len(found) == MAX_GLOB_MATCHES:
                    return found, True
                found.append((candidate, st.size))
        return found, False

    async def _root(
        self, path: str | None
    ) -> tuple[corral.provider.FileSystem, WorkspacePaths, str]:
        fs, paths = await self._open()
        return fs, paths, "/" if path is None else paths.to_workspace(path)

    async def glob(self, pattern: str, path: str | None) -> GlobResult:
        """deepagents' ``glob``: regular files under ``path`` (absolute paths), sorted."""
        try:
            fs, paths, root = await self._root(path)
            found, truncated = await self._under(fs, root, pattern)
        except InvalidGlobPatternError:
            return GlobResult(error=_BAD_GLOB)
        except (PathRefusedError, corral.WorkspaceError, corral.OperationError) as exc:
            return GlobResult(error=_message(exc, path or "/"))
        matches: list[FileInfo] = [
            {"path": paths.show(p), "is_dir": False, "size": size} for p, size in found
        ]
        return GlobResult(
            matches=matches, truncated=truncated, truncation_reason="budget" if truncated else None
        )

    async def grep(
        self, pattern: str, path: str | None, glob: str | None, max_count: int | None
    ) -> GrepResult:
        """deepagents' ``grep``: literal matches under ``path``, in files matching ``glob``."""
        cap = MAX_GREP_MATCHES if max_count is None else max(max_count, 0)
        if not pattern or cap == 0:
            return GrepResult(matches=[])
        matcher = LiteralMatcher(pattern)
        try:
            fs, paths, root = await self._root(path)
            if glob is None:
                targets = [root]
            else:
                files, _ = await self._under(fs, root, glob)
                targets = [p for p, _ in files]
            matches: list[GrepMatch] = []
            truncated = False
            for target in targets:
                options = corral.capability.GrepOptions(path=target, max_results=cap - len(matches))
                result = await fs.grep(matcher, options)
                matches.extend(
                    {"path": paths.show(m.path), "line": m.line_number, "text": m.line}
                    for m in result.matches
                )
                if result.truncated or len(matches) >= cap:
                    truncated = result.truncated or target != targets[-1]
                    break
        except InvalidGlobPatternError:
            return GrepResult(error=_BAD_GLOB)
        except (PathRefusedError, corral.WorkspaceError, corral.OperationError) as exc:
            return GrepResult(error=_message(exc, path or "/"))
        return GrepResult(matches=matches, truncated=truncated)

    async def upload(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """deepagents' ``upload_files``: each file written whole, parents created; in order."""
        out: list[FileUploadResponse] = []
        for file_path, data in files:
            failure = await self._upload(file_path, data)
            out.append(FileUploadResponse(path=file_path, error=failure and failure[0]))
        return out

    async def _upload(self, file_path: str, data: bytes) -> tuple[str, str] | None:
        """None, or the failure as (deepagents' error code, a sentence for the model)."""
        if not self._offers("workspace_write_file"):
            return "permission_denied", _READ_ONLY
        if len(data) > self._max:
            return "too_large", f"the content is over the backend's {self._max}-byte file limit"
        try:
            fs, paths = await self._open()
            await fs.write_file(paths.to_workspace(file_path), data)
        except PathRefusedError as exc:
            return "invalid_path", _message(exc, file_path)
        except corral.OperationError as exc:
            return _TRANSFER_ERRORS.get(exc.code, exc.code), _message(exc, file_path)
        except corral.WorkspaceError as exc:
            return str(exc), _message(exc, file_path)
        return None

    async def download(self, file_paths: list[str]) -> list[FileDownloadResponse]:
        """deepagents' ``download_files``: each file's bytes, or an error code; in order."""
        out: list[FileDownloadResponse] = []
        for file_path in file_paths:
            try:
                fs, paths = await self._open()
                data = await fs.read_file(paths.to_workspace(file_path), max_bytes=self._max)
            except PathRefusedError:
                out.append(FileDownloadResponse(path=file_path, error="invalid_path"))
            except corral.OperationError as exc:
                error = _TRANSFER_ERRORS.get(exc.code, exc.code)
                out.append(FileDownloadResponse(path=file_path, error=error))
            except corral.WorkspaceError as exc:
                out.append(FileDownloadResponse(path=file_path, error=str(exc)))
            else:
                out.append(FileDownloadResponse(path=file_path, content=data))
        return out

    async def delete(self, file_path: str) -> str | None:
        """deepagents' ``delete``: remove a file or a directory tree; the error, if any."""
        if not self._offers("workspace_rm"):
            return f"Error: {_READ_ONLY}"
        try:
            fs, paths = await self._open()
            path = paths.to_workspace(file_path)
            if path == "/":
                return "Error: the workspace root cannot be deleted"
            await fs.rm(path, recursive=True)
        except (PathRefusedError, corral.WorkspaceError, corral.OperationError) as exc:
            return _message(exc, file_path)
        return None


_BAD_GLOB: Final = "Error: invalid glob pattern (a '..' segment, or too many brace expansions)"

_CODE_TEXT: Final = {
    "not_found": "not found",
    "is_a_directory": "is a directory",
    "not_a_directory": "not a directory",
    "permission_denied": "permission denied",
    "too_large": "too large for this backend's file limit",
    "unsupported_file_type": "not a regular UTF-8 text file",
    "invalid_path": "invalid path",
}


def _message(exc: Exception, path: str) -> str:
    """deepagents-style error text: the canonical path and what went wrong, no raw input."""
    if isinstance(exc, PathRefusedError):
        return f"Error: invalid_path: {exc}"
    if isinstance(exc, corral.OperationError):
        shown = _shown(path)
        what = _CODE_TEXT.get(exc.code, exc.code.replace("_", " "))
        return f"Error: '{shown}': {what}" if shown else f"Error: {what}"
    # WorkspaceFailedError / WorkspaceEvictedError: corral's own advice.
    return f"Error: {exc}"


def _shown(path: str) -> str | None:
    """The caller's path in canonical form (``/a//b/`` -> ``/a/b``), or None if malformed."""
    try:
        return corral.provider.normalize_path(path) if path.startswith("/") else None
    except corral.OperationError:
        return None
