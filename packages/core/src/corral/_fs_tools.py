"""The ``fs`` capability's tools: read, write, edit, list, glob, grep, stat, mkdir, rm."""

from __future__ import annotations

import base64
import binascii
import logging
import typing
from typing import Annotated, Final, Literal, TypedDict, cast

import attrs

from . import _tool_meta as meta
from ._data import FileEntry, FileType, GrepOptions
from ._errors import OperationError
from ._mount import PathView
from ._policies import FsPolicy
from ._protocols import FileSystem
from ._schema import Arg, WorkspacePath
from ._tool import ToolEnv, ToolSpec, render_json

__all__ = ["fs_tools"]

log = logging.getLogger("corral.tools")

DEFAULT_READ_LINES: Final = 2000
MAX_LINE_CHARS: Final = 2000
MAX_GLOB_RESULTS: Final = 2000
MAX_GREP_LINE: Final = 500

Env = ToolEnv[FsPolicy, FileSystem]
Data = dict[str, object]

DirectoryPath = Annotated[str, Arg("Workspace directory (default /)", max_length=4096, path=True)]


@attrs.frozen(kw_only=True)
class ReadFileArgs:
    """``workspace_read_file``."""

    path: WorkspacePath
    offset: Annotated[int, Arg("First line, 1-based", minimum=1)] = 1
    limit: Annotated[int, Arg("Max lines", minimum=1, maximum=100000)] = DEFAULT_READ_LINES


@attrs.frozen(kw_only=True)
class WriteFileArgs:
    """``workspace_write_file``."""

    path: WorkspacePath
    content: Annotated[str, Arg("The file's new content (text, or base64 per encoding)")]
    encoding: Annotated[
        Literal["utf-8", "base64"], Arg("How content is encoded: utf-8 text or base64 bytes")
    ] = "utf-8"


@attrs.frozen(kw_only=True)
class EditFileArgs:
    """``workspace_edit_file``."""

    path: WorkspacePath
    old_text: Annotated[str, Arg("Exact text to replace", min_length=1)]
    new_text: Annotated[str, Arg("Replacement text")]
    replace_all: Annotated[bool, Arg("Replace every occurrence, not just a unique one")] = False


@attrs.frozen(kw_only=True)
class LsArgs:
    """``workspace_ls``."""

    path: DirectoryPath = "/"


@attrs.frozen(kw_only=True)
class GlobArgs:
    """``workspace_glob``."""

    pattern: Annotated[str, Arg("Glob pattern, e.g. **/*.py", min_length=1, max_length=1024)]
    path: DirectoryPath = "/"


@attrs.frozen(kw_only=True)
class GrepArgs:
    """``workspace_grep``."""

    pattern: Annotated[str, Arg("Regular expression", min_length=1, max_length=2000)]
    path: DirectoryPath = "/"
    glob: Annotated[
        str | None, Arg("Only files whose name matches, e.g. *.py", min_length=1, max_length=1024)
    ] = None
    ignore_case: Annotated[bool, Arg("Match case-insensitively")] = False
    max_results: Annotated[int, Arg("Most matches returned", minimum=1, maximum=10000)] = 200


@attrs.frozen(kw_only=True)
class PathArgs:
    """``workspace_stat``: one path."""

    path: WorkspacePath


@attrs.frozen(kw_only=True)
class MkdirArgs:
    """``workspace_mkdir``."""

    path: WorkspacePath
    parents: Annotated[bool, Arg("Create missing parents; an existing directory is fine")] = False


@attrs.frozen(kw_only=True)
class RmArgs:
    """``workspace_rm``."""

    path: WorkspacePath
    recursive: Annotated[bool, Arg("Remove a directory and everything in it")] = False


class TextFile(TypedDict):
    """read_file's result for UTF-8 text."""

    path: str
    encoding: Literal["utf-8"]
    content: str
    size: int
    total_lines: int
    offset: int
    lines_returned: int
    truncated: bool


class BinaryFile(TypedDict):
    """read_file's result for bytes that are not UTF-8."""

    path: str
    encoding: Literal["base64"]
    content: str
    size: int
    truncated: bool


def render_read(data: TextFile | BinaryFile) -> str:
    """Text files reach the model as their text, plus how to page on when truncated."""
    if data["encoding"] != "utf-8":
        return render_json(data)
    text = data["content"]
    if data["truncated"]:
        first = data["offset"]
        last = first + data["lines_returned"] - 1
        text += (
            f"\n[truncated: lines {first}-{last} of {data['total_lines']}; "
            f"call again with offset={last + 1} for more]"
        )
    return text


_FILE_TYPES: Final = frozenset(typing.get_args(FileType))


def _checked_type(value: object) -> FileType:
    """A provider's file type, refused clearly when it is not a :data:`corral.FileType`.

    Rendering would pass a misspelling (``"directory"``) on to the model as
    if it meant something; a provider bug is reported as one instead (the
    value is not echoed).
    """
    if value not in _FILE_TYPES:
        log.error("the provider returned a file type that is not a corral.FileType")
        raise OperationError(
            "the workspace provider returned an invalid file type (not one of "
            f"{', '.join(sorted(_FILE_TYPES))}); this is a provider bug",
            code="failed",
        )
    return cast(FileType, value)


def _entry(e: FileEntry, view: PathView) -> Data:
    return {
        "name": e.name,
        "path": view.show(e.path),
        "type": _checked_type(e.type),
        "size": e.size,
    }


async def _read_file(env: Env, args: ReadFileArgs) -> TextFile | BinaryFile:
    policy = env.policy
    fs = await env.module()
    path = (await env.paths()).show(args.path)
    # One module call: the provider checks the size cap before reading a byte.
    try:
        data = await fs.read_file(args.path, max_bytes=policy.max_file_bytes)
    except OperationError as exc:
        if exc.code == "too_large":
            raise OperationError(
                f"{path} is over the {policy.max_file_size_mb:g} MB read limit", code="too_large"
            ) from None
        if exc.code == "is_a_directory":
            raise OperationError(
                f"{path} is a directory; use workspace_ls", code="is_a_directory"
            ) from None
        raise
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {
            "path": path,
            "encoding": "base64",
            "content": base64.b64encode(data).decode("ascii"),
            "size": len(data),
            "truncated": False,
        }
    lines = text.splitlines(keepends=True)
    offset, limit = args.offset, args.limit
    # The common case -- the whole of a file with short lines -- is the text
    # itself: no per-line Python work (it was most of a small read's cost).
    whole = offset == 1 and limit >= len(lines)
    window = lines if whole else lines[offset - 1 : offset - 1 + limit]
    long_lines = len(text) > MAX_LINE_CHARS and max(map(len, window), default=0) > MAX_LINE_CHARS
    if long_lines:
        window = [
            line[:MAX_LINE_CHARS] + "[... line truncated]\n" if len(line) > MAX_LINE_CHARS else line
            for line in window
        ]
    truncated = offset - 1 + limit < len(lines) or long_lines
    return {
        "path": path,
        "encoding": "utf-8",
        "content": text if whole and not long_lines else "".join(window),
        "size": len(data),
        "total_lines": len(lines),
        "offset": offset,
        "lines_returned": len(window),
        "truncated": truncated,
    }


async def _write_file(env: Env, args: WriteFileArgs) -> Data:
    policy = env.policy
    if args.encoding == "base64":
        try:
            data = base64.b64decode(args.content, validate=True)
        except (binascii.Error, ValueError):
            raise OperationError(
                "argument 'content': not valid base64", code="invalid_argument"
            ) from None
    else:
        try:
            data = args.content.encode("utf-8")
        except UnicodeEncodeError:
            raise OperationError(
                "argument 'content': not valid Unicode (a lone surrogate)", code="invalid_argument"
            ) from None
    if len(data) > policy.max_file_bytes:
        raise OperationError(
            f"content is {len(data)} bytes, over the {policy.max_file_size_mb:g} MB write limit",
            code="too_large",
        )
    fs = await env.module()
    await fs.write_file(args.path, data)
    return {"path": (await env.paths()).show(args.path), "bytes_written": len(data)}


async def _edit_file(env: Env, args: EditFileArgs) -> Data:
    if args.old_text == args.new_text:
        raise OperationError("old_text and new_text are identical", code="invalid_argument")
    fs = await env.module()
    count = await fs.edit_file(
        args.path, args.old_text, args.new_text, replace_all=args.replace_all
    )
    return {"path": (await env.paths()).show(args.path), "replacements": count}


async def _ls(env: Env, args: LsArgs) -> Data:
    fs = await env.module()
    entries = await fs.ls(args.path)
    view = await env.paths()
    return {"path": view.show(args.path), "entries": [_entry(e, view) for e in entries]}


async def _glob(env: Env, args: GlobArgs) -> Data:
    fs = await env.module()
    matches = list(await fs.glob(args.pattern, args.path))
    truncated = len(matches) > MAX_GLOB_RESULTS
    view = await env.paths()
    return {"matches": [view.show(m) for m in matches[:MAX_GLOB_RESULTS]], "truncated": truncated}


async def _grep(env: Env, args: GrepArgs) -> Data:
    matcher = env.regex_engine.compile(args.pattern, ignore_case=args.ignore_case)
    options = GrepOptions(
        path=args.path,
        glob=args.glob,
        ignore_case=args.ignore_case,
        max_results=args.max_results,
    )
    fs = await env.module()
    result = await fs.grep(matcher, options)
    view = await env.paths()
    return {
        "matches": [
            {
                "path": view.show(m.path),
                "line_number": m.line_number,
                "line": m.line if len(m.line) <= MAX_GREP_LINE else m.line[:MAX_GREP_LINE] + "…",
            }
            for m in result.matches
        ],
        "skipped_paths": [view.show(p) for p in result.skipped_paths],
        "skipped_binary_paths": [view.show(p) for p in result.skipped_binary_paths],
        "truncated": result.truncated,
    }


async def _stat(env: Env, args: PathArgs) -> Data:
    fs = await env.module()
    st = await fs.stat(args.path)
    return {
        "path": (await env.paths()).show(st.path),
        "type": _checked_type(st.type),
        "size": st.size,
        "mtime": st.mtime,
        "mode": oct(st.mode),
    }


async def _mkdir(env: Env, args: MkdirArgs) -> Data:
    fs = await env.module()
    await fs.mkdir(args.path, parents=args.parents)
    return {"path": (await env.paths()).show(args.path), "created": True}


async def _rm(env: Env, args: RmArgs) -> Data:
    if args.path == "/":
        raise OperationError("refusing to remove the workspace root", code="invalid_argument")
    fs = await env.module()
    await fs.rm(args.path, recursive=args.recursive)
    return {"path": (await env.paths()).show(args.path), "removed": True}


def fs_tools(policy: FsPolicy) -> list[ToolSpec[FsPolicy, FileSystem]]:
    """Tool specs of the ``fs`` capability (read-only policy: no mutating tools)."""
    read: list[ToolSpec[FsPolicy, FileSystem]] = [
        ToolSpec(
            "workspace_read_file",
            "Read a file from the workspace. UTF-8 text comes back as text; other files as "
            "base64 (encoding says which). Use offset (1-based line) and limit (lines) to page "
            "through large files; 'truncated' tells whether more remains.",
            ReadFileArgs,
            _read_file,
            hints=meta.READS,
            output_schema=meta.READ_FILE,
            render=render_read,
        ),
        ToolSpec(
            "workspace_ls",
            "List a workspace directory: name, path, type and size of each entry.",
            LsArgs,
            _ls,
            hints=meta.READS,
            output_schema=meta.LS,
        ),
        ToolSpec(
            "workspace_glob",
            "Find files and directories by glob pattern (*, ?, [abc], ** for any depth), "
            "relative to path (default /). Example: **/*.py",
            GlobArgs,
            _glob,
            hints=meta.READS,
            output_schema=meta.GLOB,
        ),
        ToolSpec(
            "workspace_grep",
            "Search file contents with a regular expression, line by line. Optional path "
            "(directory or file), glob filter (e.g. *.py), ignore_case and max_results. Binary "
            "and skipped files are listed so 'no match' is never ambiguous.",
            GrepArgs,
            _grep,
            hints=meta.READS,
            output_schema=meta.GREP,
        ),
        ToolSpec(
            "workspace_stat",
            "Describe a path: type (file, dir, symlink, other), size, mtime, mode.",
            PathArgs,
            _stat,
            hints=meta.READS,
            output_schema=meta.STAT,
        ),
    ]
    if policy.read_only:
        return read
    write: list[ToolSpec[FsPolicy, FileSystem]] = [
        ToolSpec(
            "workspace_write_file",
            "Create or replace a file (parent directories are created). Content is UTF-8 text, "
            "or base64 with encoding='base64'. The write is atomic.",
            WriteFileArgs,
            _write_file,
            hints=meta.OVERWRITES,
            output_schema=meta.WRITE_FILE,
        ),
        ToolSpec(
            "workspace_edit_file",
            "Replace old_text with new_text in a text file. Fails if old_text is absent, or "
            "appears more than once unless replace_all is true.",
            EditFileArgs,
            _edit_file,
            hints=meta.DESTROYS,
            output_schema=meta.EDIT_FILE,
        ),
        ToolSpec(
            "workspace_mkdir",
            "Create a directory; parents=true creates missing parents and accepts an existing one.",
            MkdirArgs,
            _mkdir,
            hints=meta.ADDS,
            output_schema=meta.MKDIR,
        ),
        ToolSpec(
            "workspace_rm",
            "Remove a file or empty directory; recursive=true removes a directory tree.",
            RmArgs,
            _rm,
            hints=meta.OVERWRITES,
            output_schema=meta.RM,
        ),
    ]
    return read[:1] + write[:2] + read[1:] + write[2:]
