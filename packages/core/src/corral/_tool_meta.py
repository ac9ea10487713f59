"""What the built-in tools declare about themselves: hints and result schemas.

The hints are MCP's tool annotations; the result schemas are the JSON Schema
of each handler's structured result (MCP ``outputSchema``, the Responses API's
``output_schema``). A host that validates structured results against them
(the MCP client does) proves they match the handlers, which the MCP tests
exercise for every built-in tool.
"""

from __future__ import annotations

from typing import Final

from ._schema import JsonSchema
from ._tool import ToolHints

__all__ = [
    "ADDS",
    "DESTROYS",
    "EXEC_RESULT",
    "OVERWRITES",
    "READS",
    "RUNS",
    "output",
]

READS: Final = ToolHints(read_only=True, destructive=False, idempotent=True, open_world=False)
"""Looks, changes nothing."""

ADDS: Final = ToolHints(destructive=False, idempotent=False, open_world=False)
"""Adds to the workspace without touching what was there."""

OVERWRITES: Final = ToolHints(destructive=True, idempotent=True, open_world=False)
"""Replaces what was there; the same call again changes nothing more."""

DESTROYS: Final = ToolHints(destructive=True, idempotent=False, open_world=False)
"""Changes what was there; the same call again may change it again or fail."""

RUNS: Final = ToolHints(destructive=True, idempotent=False, open_world=True)
"""Runs arbitrary code: anything may happen, within the provider's boundary."""


def output(required: dict[str, object], optional: dict[str, object] | None = None) -> JsonSchema:
    """An object schema from ``{key: type-or-schema}``; ``"string?"`` means nullable."""

    def one(spec: object) -> object:
        if isinstance(spec, str):
            kind = spec.rstrip("?")
            return {"type": [kind, "null"]} if spec.endswith("?") else {"type": kind}
        return spec

    properties = {k: one(v) for k, v in {**required, **(optional or {})}.items()}
    return {"type": "object", "properties": properties, "required": list(required)}


def array_of(items: JsonSchema) -> JsonSchema:
    """An array schema."""
    return {"type": "array", "items": items}


EXEC_RESULT: Final = output(
    {
        "exit_code": "integer?",
        "stdout": "string",
        "stderr": "string",
        "stdout_truncated": "boolean",
        "stderr_truncated": "boolean",
        "timed_out": "boolean",
        "signal": "integer?",
        "duration_ms": "number",
    }
)
"""``exec_data``: a command's or a snippet's outcome."""

_PATH: Final = "string"

READ_FILE: Final = output(
    {"path": _PATH, "encoding": {"enum": ["utf-8", "base64"]}, "content": "string"},
    {
        "size": "integer",
        "total_lines": "integer",
        "offset": "integer",
        "lines_returned": "integer",
        "truncated": "boolean",
    },
)
WRITE_FILE: Final = output({"path": _PATH, "bytes_written": "integer"})
EDIT_FILE: Final = output({"path": _PATH, "replacements": "integer"})
LS: Final = output(
    {
        "path": _PATH,
        "entries": array_of(
            output({"name": "string", "path": _PATH, "type": "string", "size": "integer"})
        ),
    }
)
GLOB: Final = output({"matches": array_of({"type": "string"}), "truncated": "boolean"})
GREP: Final = output(
    {
        "matches": array_of(output({"path": _PATH, "line_number": "integer", "line": "string"})),
        "skipped_paths": array_of({"type": "string"}),
        "skipped_binary_paths": array_of({"type": "string"}),
        "truncated": "boolean",
    }
)
STAT: Final = output(
    {"path": _PATH, "type": "string", "size": "integer", "mtime": "number", "mode": "string"}
)
MKDIR: Final = output({"path": _PATH, "created": "boolean"})
RM: Final = output({"path": _PATH, "removed": "boolean"})

CONTEXT_CREATED: Final = output({"context_id": "string"})
CONTEXT_DELETED: Final = output({"context_id": "string", "deleted": "boolean"})

SNAPSHOT_INFO: Final = output(
    {
        "snapshot_id": "string",
        "created_at": "number",
        "label": "string?",
        "size_bytes": "integer?",
    }
)
RESTORED: Final = output({"restored": "string"})
SNAPSHOTS: Final = output({"snapshots": array_of(SNAPSHOT_INFO)})
SNAPSHOT_DELETED: Final = output({"deleted": "string"})
BRANCHED: Final = output({"branched_from": "string", "workspace_id": "string"})
