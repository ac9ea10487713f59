"""Tools of the ``snapshot`` capability: snapshot, restore, list, delete, branch.

Restore and branch move the session to the workspace the snapshot module
returns (through ``env.session.adopt``), which is why this capability is
registered with ``controls_session=True``. Each snapshot, restore and branch
is reported as a ``CapabilityEvent`` named ``snapshot`` whose status says
which.
"""

from __future__ import annotations

from typing import Annotated

import attrs

from . import _tool_meta as meta
from ._data import SnapshotInfo
from ._errors import OperationError
from ._policies import SnapshotPolicy
from ._protocols import Snapshotter
from ._schema import Arg
from ._tool import ToolEnv, ToolSpec
from ._version_tools import version_tools

__all__ = ["NoArgs", "SnapshotArgs", "SnapshotIdArgs", "snapshot_tools"]

Data = dict[str, object]
SnapshotId = Annotated[
    str, Arg("A snapshot_id from workspace_snapshot", min_length=1, max_length=200)
]


@attrs.frozen(kw_only=True)
class SnapshotArgs:
    """``workspace_snapshot``."""

    label: Annotated[str | None, Arg("A note to recognise the snapshot by", max_length=200)] = None


@attrs.frozen(kw_only=True)
class SnapshotIdArgs:
    """``workspace_restore``, ``workspace_delete_snapshot``, ``workspace_branch``."""

    snapshot_id: SnapshotId


@attrs.frozen
class NoArgs:
    """A tool without arguments."""


SnapEnv = ToolEnv[SnapshotPolicy, Snapshotter]


def _info(info: SnapshotInfo) -> Data:
    return {
        "snapshot_id": info.snapshot_id,
        "created_at": info.created_at,
        "label": info.label,
        "size_bytes": info.size_bytes,
    }


async def _snapshot(env: SnapEnv, args: SnapshotArgs) -> Data:
    policy = env.policy
    snap = await env.module()
    if len(await snap.list()) >= policy.max_snapshots:
        raise OperationError(
            f"this workspace already holds {policy.max_snapshots} snapshots; delete one first",
            code="policy_denied",
        )
    info = await snap.snapshot(args.label)
    env.session.emit("snapshot", status="snapshot", detail={"snapshot_id": info.snapshot_id})
    return _info(info)


async def _restore(env: SnapEnv, args: SnapshotIdArgs) -> Data:
    snap = await env.module()
    ref = await snap.restore(args.snapshot_id)
    await env.session.adopt(ref)
    env.session.emit("snapshot", status="restore", detail={"snapshot_id": args.snapshot_id})
    return {"restored": args.snapshot_id}


async def _list_snapshots(env: SnapEnv, args: NoArgs) -> Data:
    snap = await env.module()
    return {"snapshots": [_info(i) for i in await snap.list()]}


async def _delete_snapshot(env: SnapEnv, args: SnapshotIdArgs) -> Data:
    snap = await env.module()
    await snap.delete(args.snapshot_id)
    return {"deleted": args.snapshot_id}


async def _branch(env: SnapEnv, args: SnapshotIdArgs) -> Data:
    snap = await env.module()
    ref = await snap.branch(args.snapshot_id)
    workspace_id = await env.session.adopt(ref)
    env.session.emit("snapshot", status="branch", detail={"snapshot_id": args.snapshot_id})
    return {"branched_from": args.snapshot_id, "workspace_id": workspace_id}


def snapshot_tools(policy: SnapshotPolicy) -> list[ToolSpec[SnapshotPolicy, Snapshotter]]:
    """The five snapshot tools, then the two that read versions (:mod:`._version_tools`)."""
    return [
        ToolSpec(
            "workspace_snapshot",
            "Save the current state of the workspace; returns a snapshot_id for restore or branch.",
            SnapshotArgs,
            _snapshot,
            hints=meta.ADDS,
            output_schema=meta.SNAPSHOT_INFO,
        ),
        ToolSpec(
            "workspace_restore",
            "Bring the workspace back to exactly a snapshot's state (later changes are lost).",
            SnapshotIdArgs,
            _restore,
            hints=meta.OVERWRITES,
            output_schema=meta.RESTORED,
        ),
        ToolSpec(
            "workspace_list_snapshots",
            "List this workspace's snapshots, oldest first.",
            NoArgs,
            _list_snapshots,
            hints=meta.READS,
            output_schema=meta.SNAPSHOTS,
        ),
        ToolSpec(
            "workspace_delete_snapshot",
            "Delete a snapshot.",
            SnapshotIdArgs,
            _delete_snapshot,
            hints=meta.OVERWRITES,
            output_schema=meta.SNAPSHOT_DELETED,
        ),
        ToolSpec(
            "workspace_branch",
            "Continue in a new, separate workspace seeded from a snapshot; the current "
            "workspace is left as it is.",
            SnapshotIdArgs,
            _branch,
            hints=meta.ADDS,
            output_schema=meta.BRANCHED,
        ),
        *version_tools(policy),
    ]
