"""Live file operations: a materialised box's ``fs`` module called over the API.

``POST /v1/workspaces/{id}/live/fs`` takes ``{"op": ..., ...arguments}``
and calls that method of the live box's ``fs`` module (materialising the
box when needed), so a remote library user -- ``corral mcp --workspace`` --
gets the provider's own file semantics rather than a second implementation.
Reads of stored versions stay on ``files/*`` (no box).

Every argument is type-checked here before the module sees it. A module
error answers ``422 operation_failed`` with the module's stable code in
``op_code`` and a fixed message per code: the module's own message may quote
a path the client sent, and the service never echoes client input.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, Final, get_args

import attrs

from corral import get_regex_engine
from corral.provider import ErrorCode, FileSystem, GrepOptions, OperationError

from ._errors import ServiceError
from ._model import check_bool, check_int, check_str

__all__ = ["MAX_LIVE_READ", "OP_MESSAGES", "fs_call"]

MAX_LIVE_READ: Final = 16 << 20
"""Largest file ``read_file`` returns (base64 in a JSON answer)."""

OP_MESSAGES: Final[dict[str, str]] = {
    "not_found": "no such file or directory",
    "exists": "the path already exists",
    "is_a_directory": "the path is a directory",
    "not_a_directory": "a component of the path is not a directory",
    "not_empty": "the directory is not empty",
    "invalid_path": "the path is not a valid workspace path",
    "invalid_argument": "an argument was refused",
    "unsupported_file_type": "the path is not a regular UTF-8 file",
    "too_large": "the file or value is too large",
    "permission_denied": "permission denied",
    "policy_denied": "the workspace policy refused the operation",
    "not_unique": "the text to replace occurs more than once",
    "no_match": "the text to replace does not occur",
    "timeout": "the operation ran out of time",
    "unsupported": "the operation is not supported",
    "closed": "the workspace is closed",
}
"""The message the API gives for each module error code (never the module's own text)."""

_OPS: Final = frozenset(
    {"read_file", "write_file", "edit_file", "ls", "glob", "grep", "stat", "mkdir", "rm"}
)
_CODES: Final = frozenset(get_args(ErrorCode))


def _path(body: Mapping[str, Any], key: str = "path", default: str | None = None) -> str:
    value = body.get(key, default)
    return check_str(value, key, max_len=4096)


def _allowed(body: Mapping[str, Any], *keys: str) -> None:
    if set(body) - {"op", *keys}:
        raise ServiceError("the request has an unknown field")


async def fs_call(fs: FileSystem, body: Mapping[str, Any]) -> dict[str, Any]:
    """Run one ``fs`` operation described by ``body``; its JSON result.

    Raises:
        ServiceError: ``invalid_argument`` for a malformed request,
            ``operation_failed`` (with ``op_code``) when the module refused.
    """
    op = body.get("op")
    if not isinstance(op, str) or op not in _OPS:
        raise ServiceError("op is not a file operation")
    try:
        return await _dispatch(fs, op, body)
    except OperationError as exc:
        code = str(exc.code) if str(exc.code) in _CODES else "failed"
        raise ServiceError(
            OP_MESSAGES.get(code, "the file operation failed"),
            code="operation_failed",
            extra={"op_code": code},
        ) from None


async def _dispatch(fs: FileSystem, op: str, body: Mapping[str, Any]) -> dict[str, Any]:
    if op == "read_file":
        _allowed(body, "path", "max_bytes")
        cap = check_int(body.get("max_bytes", MAX_LIVE_READ), "max_bytes", lo=0, hi=MAX_LIVE_READ)
        data = await fs.read_file(_path(body), max_bytes=cap)
        return {"data": base64.b64encode(data).decode("ascii")}
    if op == "write_file":
        _allowed(body, "path", "data")
        try:
            text = check_str(body.get("data"), "data", empty=True, max_len=1 << 30)
            data = base64.b64decode(text, validate=True)
        except ValueError:
            raise ServiceError("data must be base64") from None
        await fs.write_file(_path(body), data)
        return {}
    if op == "edit_file":
        _allowed(body, "path", "old_text", "new_text", "replace_all")
        count = await fs.edit_file(
            _path(body),
            check_str(body.get("old_text"), "old_text", empty=True, max_len=1 << 20),
            check_str(body.get("new_text"), "new_text", empty=True, max_len=1 << 20),
            replace_all=check_bool(body.get("replace_all", False), "replace_all"),
        )
        return {"count": count}
    if op == "ls":
        _allowed(body, "path")
        return {"entries": [attrs.asdict(e) for e in await fs.ls(_path(body, default="/"))]}
    if op == "glob":
        _allowed(body, "pattern", "path")
        pattern = check_str(body.get("pattern"), "pattern", max_len=4096)
        return {"paths": list(await fs.glob(pattern, _path(body, default="/")))}
    if op == "stat":
        _allowed(body, "path")
        return attrs.asdict(await fs.stat(_path(body)))
    if op == "mkdir":
        _allowed(body, "path", "parents")
        await fs.mkdir(_path(body), parents=check_bool(body.get("parents", False), "parents"))
        return {}
    if op == "rm":
        _allowed(body, "path", "recursive")
        await fs.rm(_path(body), recursive=check_bool(body.get("recursive", False), "recursive"))
        return {}
    # grep: the pattern is compiled here, by the service's regex engine (with its timeout).
    _allowed(body, "pattern", "path", "glob", "ignore_case", "max_results")
    glob = body.get("glob")
    options = GrepOptions(
        path=_path(body, default="/"),
        glob=None if glob is None else check_str(glob, "glob", max_len=4096),
        ignore_case=check_bool(body.get("ignore_case", False), "ignore_case"),
        max_results=check_int(body.get("max_results", 1000), "max_results", lo=1, hi=100_000),
    )
    matcher = get_regex_engine().compile(
        check_str(body.get("pattern"), "pattern", max_len=4096), ignore_case=options.ignore_case
    )
    result = await fs.grep(matcher, options)
    return attrs.asdict(result)
