"""The ``fs`` capability's tools: read, write, edit, list, glob, grep, stat, mkdir, rm."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Final

from ._data import FileEntry, GrepOptions
from ._errors import OperationError
from ._paths import normalize_path
from ._policies import FsPolicy
from ._tool import ToolEnv, ToolSpec
from ._tool import object_schema as _schema

__all__ = ["fs_tools"]

DEFAULT_READ_LINES: Final = 2000
MAX_LINE_CHARS: Final = 2000
MAX_GLOB_RESULTS: Final = 2000
MAX_GREP_LINE: Final = 500

_PATH = {
    "type": "string",
    "minLength": 1,
    "maxLength": 4096,
    "description": "Workspace path, e.g. /notes/a.txt",
}
_OPT_PATH = {"type": "string", "maxLength": 4096, "description": "Workspace directory (default /)"}


def _entry(e: FileEntry) -> dict[str, Any]:
    return {"name": e.name, "path": e.path, "type": e.type, "size": e.size}


async def _read_file(env: ToolEnv, args: dict[str, Any]) -> Any:
    policy: FsPolicy = env.policy
    path = normalize_path(args["path"])
    fs = await env.module("fs")
    # One module call: the provider checks the size cap before reading a byte.
    try:
        data: bytes = await fs.read_file(path, max_bytes=policy.max_file_bytes)
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
    offset = args.get("offset", 1)
    limit = args.get("limit", DEFAULT_READ_LINES)
    window = lines[offset - 1 : offset - 1 + limit]
    long_lines = any(len(line) > MAX_LINE_CHARS for line in window)
    if long_lines:
        window = [
            line[:MAX_LINE_CHARS] + "[... line truncated]\n" if len(line) > MAX_LINE_CHARS else line
            for line in window
        ]
    truncated = offset - 1 + limit < len(lines) or long_lines
    return {
        "path": path,
        "encoding": "utf-8",
        "content": "".join(window),
        "size": len(data),
        "total_lines": len(lines),
        "offset": offset,
        "lines_returned": len(window),
        "truncated": truncated,
    }


async def _write_file(env: ToolEnv, args: dict[str, Any]) -> Any:
    policy: FsPolicy = env.policy
    path = normalize_path(args["path"])
    content: str = args["content"]
    if args.get("encoding", "utf-8") == "base64":
        try:
            data = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise OperationError(
                "argument 'content': not valid base64", code="invalid_argument"
            ) from None
    else:
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:
            raise OperationError(
                "argument 'content': not valid Unicode (a lone surrogate)", code="invalid_argument"
            ) from None
    if len(data) > policy.max_file_bytes:
        raise OperationError(
            f"content is {len(data)} bytes, over the {policy.max_file_size_mb:g} MB write limit",
            code="too_large",
        )
    fs = await env.module("fs")
    await fs.write_file(path, data)
    return {"path": path, "bytes_written": len(data)}


async def _edit_file(env: ToolEnv, args: dict[str, Any]) -> Any:
    path = normalize_path(args["path"])
    if args["old_text"] == args["new_text"]:
        raise OperationError("old_text and new_text are identical", code="invalid_argument")
    fs = await env.module("fs")
    count = await fs.edit_file(
        path, args["old_text"], args["new_text"], replace_all=args.get("replace_all", False)
    )
    return {"path": path, "replacements": count}


async def _ls(env: ToolEnv, args: dict[str, Any]) -> Any:
    path = normalize_path(args.get("path", "/"))
    fs = await env.module("fs")
    entries = await fs.ls(path)
    return {"path": path, "entries": [_entry(e) for e in entries]}


async def _glob(env: ToolEnv, args: dict[str, Any]) -> Any:
    path = normalize_path(args.get("path", "/"))
    fs = await env.module("fs")
    matches = list(await fs.glob(args["pattern"], path))
    truncated = len(matches) > MAX_GLOB_RESULTS
    return {"matches": matches[:MAX_GLOB_RESULTS], "truncated": truncated}


async def _grep(env: ToolEnv, args: dict[str, Any]) -> Any:
    matcher = env.regex_engine.compile(args["pattern"], ignore_case=args.get("ignore_case", False))
    options = GrepOptions(
        path=normalize_path(args.get("path", "/")),
        glob=args.get("glob"),
        ignore_case=args.get("ignore_case", False),
        max_results=args.get("max_results", 200),
    )
    fs = await env.module("fs")
    result = await fs.grep(matcher, options)
    return {
        "matches": [
            {
                "path": m.path,
                "line_number": m.line_number,
                "line": m.line if len(m.line) <= MAX_GREP_LINE else m.line[:MAX_GREP_LINE] + "…",
            }
            for m in result.matches
        ],
        "skipped_paths": list(result.skipped_paths),
        "skipped_binary_paths": list(result.skipped_binary_paths),
        "truncated": result.truncated,
    }


async def _stat(env: ToolEnv, args: dict[str, Any]) -> Any:
    path = normalize_path(args["path"])
    fs = await env.module("fs")
    st = await fs.stat(path)
    return {
        "path": st.path,
        "type": st.type,
        "size": st.size,
        "mtime": st.mtime,
        "mode": oct(st.mode),
    }


async def _mkdir(env: ToolEnv, args: dict[str, Any]) -> Any:
    path = normalize_path(args["path"])
    fs = await env.module("fs")
    await fs.mkdir(path, parents=args.get("parents", False))
    return {"path": path, "created": True}


async def _rm(env: ToolEnv, args: dict[str, Any]) -> Any:
    path = normalize_path(args["path"])
    if path == "/":
        raise OperationError("refusing to remove the workspace root", code="invalid_argument")
    fs = await env.module("fs")
    await fs.rm(path, recursive=args.get("recursive", False))
    return {"path": path, "removed": True}


def fs_tools(policy: FsPolicy) -> list[ToolSpec]:
    """Tool specs of the ``fs`` capability (read-only policy: no mutating tools)."""
    read = [
        ToolSpec(
            "workspace_read_file",
            "Read a file from the workspace. UTF-8 text comes back as text; other files as "
            "base64 (encoding says which). Use offset (1-based line) and limit (lines) to page "
            "through large files; 'truncated' tells whether more remains.",
            _schema(
                {
                    "path": _PATH,
                    "offset": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "First line, 1-based",
                    },
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 100000,
                        "description": "Max lines",
                    },
                },
                ["path"],
            ),
            _read_file,
            "read_file",
        ),
        ToolSpec(
            "workspace_ls",
            "List a workspace directory: name, path, type and size of each entry.",
            _schema({"path": _OPT_PATH}, []),
            _ls,
            "ls",
        ),
        ToolSpec(
            "workspace_glob",
            "Find files and directories by glob pattern (*, ?, [abc], ** for any depth), "
            "relative to path (default /). Example: **/*.py",
            _schema(
                {
                    "pattern": {"type": "string", "minLength": 1, "maxLength": 1024},
                    "path": _OPT_PATH,
                },
                ["pattern"],
            ),
            _glob,
            "glob",
        ),
        ToolSpec(
            "workspace_grep",
            "Search file contents with a regular expression, line by line. Optional path "
            "(directory or file), glob filter (e.g. *.py), ignore_case and max_results. Binary "
            "and skipped files are listed so 'no match' is never ambiguous.",
            _schema(
                {
                    "pattern": {"type": "string", "minLength": 1, "maxLength": 2000},
                    "path": _OPT_PATH,
                    "glob": {"type": "string", "minLength": 1, "maxLength": 1024},
                    "ignore_case": {"type": "boolean"},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 10000},
                },
                ["pattern"],
            ),
            _grep,
            "grep",
        ),
        ToolSpec(
            "workspace_stat",
            "Describe a path: type (file, dir, symlink, other), size, mtime, mode.",
            _schema({"path": _PATH}, ["path"]),
            _stat,
            "stat",
        ),
    ]
    if policy.read_only:
        return read
    write = [
        ToolSpec(
            "workspace_write_file",
            "Create or replace a file (parent directories are created). Content is UTF-8 text, "
            "or base64 with encoding='base64'. The write is atomic.",
            _schema(
                {
                    "path": _PATH,
                    "content": {"type": "string"},
                    "encoding": {"type": "string", "enum": ["utf-8", "base64"]},
                },
                ["path", "content"],
            ),
            _write_file,
            "write_file",
        ),
        ToolSpec(
            "workspace_edit_file",
            "Replace old_text with new_text in a text file. Fails if old_text is absent, or "
            "appears more than once unless replace_all is true.",
            _schema(
                {
                    "path": _PATH,
                    "old_text": {"type": "string", "minLength": 1},
                    "new_text": {"type": "string"},
                    "replace_all": {"type": "boolean"},
                },
                ["path", "old_text", "new_text"],
            ),
            _edit_file,
            "edit_file",
        ),
        ToolSpec(
            "workspace_mkdir",
            "Create a directory; parents=true creates missing parents and accepts an existing one.",
            _schema({"path": _PATH, "parents": {"type": "boolean"}}, ["path"]),
            _mkdir,
            "mkdir",
        ),
        ToolSpec(
            "workspace_rm",
            "Remove a file or empty directory; recursive=true removes a directory tree.",
            _schema({"path": _PATH, "recursive": {"type": "boolean"}}, ["path"]),
            _rm,
            "rm",
        ),
    ]
    return read[:1] + write[:2] + read[1:] + write[2:]
