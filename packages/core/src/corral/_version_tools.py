"""The ``snapshot`` capability's tools for reading versions: what changed, and a file as it was.

Both read the stored snapshot only (:class:`corral.provider.Versions`); neither
changes the workspace. A snapshot module that is a plain
:class:`corral.provider.Snapshotter` answers ``unsupported``.
"""

from __future__ import annotations

import base64
from typing import Annotated, Final

import attrs

from . import _tool_meta as meta
from ._errors import OperationError
from ._policies import SnapshotPolicy
from ._protocols import Snapshotter, Versions
from ._schema import Arg
from ._tool import ToolEnv, ToolSpec

__all__ = ["MAX_CHANGES", "MAX_READ_BYTES", "ReadAtArgs", "SinceArgs", "version_tools"]

MAX_CHANGES: Final = 1000
"""Most changes one ``workspace_changes_since_snapshot`` reports (the rest are counted)."""
MAX_READ_BYTES: Final = 10 * 1024 * 1024
"""Largest file ``workspace_read_file_at_snapshot`` returns."""

Data = dict[str, object]
SnapshotId = Annotated[
    str, Arg("A snapshot_id from workspace_snapshot", min_length=1, max_length=200)
]


@attrs.frozen(kw_only=True)
class SinceArgs:
    """``workspace_changes_since_snapshot``."""

    snapshot_id: SnapshotId


@attrs.frozen(kw_only=True)
class ReadAtArgs:
    """``workspace_read_file_at_snapshot``."""

    snapshot_id: SnapshotId
    path: Annotated[str, Arg("The file's path in the workspace", max_length=4096, path=True)]


Env = ToolEnv[SnapshotPolicy, Snapshotter]


async def _versions(env: Env) -> Versions:
    snap = await env.module()
    if not isinstance(snap, Versions):
        raise OperationError(
            "this workspace's snapshots cannot be read without restoring them", code="unsupported"
        )
    return snap


async def _changes(env: Env, args: SinceArgs) -> Data:
    changes = await (await _versions(env)).diff(args.snapshot_id)
    shown = [
        {
            "path": c.path,
            "change": c.change,
            "type": c.type,
            "old_size": c.old_size,
            "new_size": c.new_size,
        }
        for c in changes[:MAX_CHANGES]
    ]
    return {
        "snapshot_id": args.snapshot_id,
        "changes": shown,
        "total": len(changes),
        "truncated": len(changes) > MAX_CHANGES,
    }


async def _read_at(env: Env, args: ReadAtArgs) -> Data:
    data = await (await _versions(env)).read_file_at(
        args.snapshot_id, args.path, max_bytes=MAX_READ_BYTES
    )
    try:
        text, encoding = data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(data).decode("ascii"), "base64"
    return {
        "snapshot_id": args.snapshot_id,
        "path": args.path,
        "encoding": encoding,
        "content": text,
        "size": len(data),
    }


_CHANGE: Final = meta.output(
    {"path": "string", "change": {"enum": ["added", "removed", "modified"]}, "type": "string"},
    {"old_size": "integer?", "new_size": "integer?"},
)


def version_tools(policy: SnapshotPolicy) -> list[ToolSpec[SnapshotPolicy, Snapshotter]]:
    """The two version-reading tools (added to the snapshot capability's five)."""
    del policy  # nothing in them is policy-dependent
    return [
        ToolSpec(
            "workspace_changes_since_snapshot",
            "List the files and directories added, removed or modified (content or mode) "
            "since a snapshot, with sizes. Changes nothing.",
            SinceArgs,
            _changes,
            hints=meta.READS,
            output_schema=meta.output(
                {
                    "snapshot_id": "string",
                    "changes": meta.array_of(_CHANGE),
                    "total": "integer",
                    "truncated": "boolean",
                }
            ),
        ),
        ToolSpec(
            "workspace_read_file_at_snapshot",
            "Read a file as it was when a snapshot was taken, without restoring it.",
            ReadAtArgs,
            _read_at,
            hints=meta.READS,
            output_schema=meta.output(
                {
                    "snapshot_id": "string",
                    "path": "string",
                    "encoding": {"enum": ["utf-8", "base64"]},
                    "content": "string",
                    "size": "integer",
                }
            ),
        ),
    ]
