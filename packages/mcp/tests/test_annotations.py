"""MCP tools carry their hints and result schemas; the official client validates each result.

The SDK's ``ClientSession.call_tool`` checks ``structuredContent`` against the
tool's ``outputSchema`` and raises when they disagree, so calling every
built-in tool through it proves each declared schema against its handler.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import corral

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings(
        r"ignore:Exception ignored in. <async_generator object "
        r"(EventSource|PoolByteStream|Response)\.:pytest.PytestUnraisableExceptionWarning"
    ),
]

CALL_TIMEOUT_S = 60.0
CAPABILITIES = {"fs": True, "shell": True, "snapshot": True}


@pytest.mark.usefixtures("require_local_bash")
@pytest.mark.parametrize("connect", ["stdio"], indirect=True)
async def test_every_tool_is_annotated_and_its_results_match_its_schema(
    connect: Callable[[list[str]], Any], backend_args: list[str]
) -> None:
    async with corral.open_workspace("local-bash", CAPABILITIES) as ws:
        declared = {t.name: t for t in ws.tools}
    args = ["--provider", "local-bash", "--capabilities", json.dumps(CAPABILITIES)]
    async with connect([*args, *backend_args]) as client:
        with anyio.fail_after(CALL_TIMEOUT_S):
            listed = {t.name: t for t in (await client.list_tools()).tools}
            assert set(listed) == set(declared)
            for name, tool in listed.items():
                hints = declared[name].hints
                assert hints is not None, name
                assert tool.annotations is not None, name
                assert tool.annotations.read_only_hint == hints.read_only, name
                assert tool.annotations.destructive_hint == hints.destructive, name
                assert tool.annotations.idempotent_hint == hints.idempotent, name
                assert tool.annotations.open_world_hint == hints.open_world, name
                assert tool.output_schema == declared[name].output_schema, name
            called = await _call_every_tool(client)
    assert called == set(listed)


async def _call_every_tool(client: Any) -> set[str]:
    called: set[str] = set()

    async def call(name: str, arguments: dict[str, Any]) -> Any:
        # Raises if the structured result does not match the tool's outputSchema.
        result = await client.call_tool(name, arguments)
        assert not result.is_error, (name, result.content)
        assert result.structured_content is not None, name
        called.add(name)
        return result.structured_content

    await call("workspace_write_file", {"path": "/d/a.txt", "content": "one\ntwo\n"})
    await call("workspace_read_file", {"path": "/d/a.txt"})
    await call(
        "workspace_write_file", {"path": "/bin.dat", "content": "/w==", "encoding": "base64"}
    )
    binary = await call("workspace_read_file", {"path": "/bin.dat"})
    assert binary["encoding"] == "base64"
    await call("workspace_edit_file", {"path": "/d/a.txt", "old_text": "two", "new_text": "2"})
    await call("workspace_ls", {"path": "/d"})
    await call("workspace_glob", {"pattern": "**/*.txt"})
    await call("workspace_grep", {"pattern": "one"})
    await call("workspace_stat", {"path": "/d/a.txt"})
    await call("workspace_mkdir", {"path": "/e"})
    await call("workspace_run", {"command": "ls"})
    snap = await call("workspace_snapshot", {"label": "first"})
    await call("workspace_list_snapshots", {})
    await call("workspace_rm", {"path": "/e"})
    for name in ("workspace_read_file_at_snapshot", "workspace_changes_since_snapshot"):
        # Snapshot tools another change adds; call them when this build has them.
        tools = {t.name: t for t in (await client.list_tools()).tools}
        if name in tools:
            arguments = {"snapshot_id": snap["snapshot_id"]}
            if "path" in tools[name].input_schema.get("properties", {}):
                arguments["path"] = "/d/a.txt"
            await call(name, arguments)
    spare = await call("workspace_snapshot", {})
    await call("workspace_delete_snapshot", {"snapshot_id": spare["snapshot_id"]})
    await call("workspace_restore", {"snapshot_id": snap["snapshot_id"]})
    await call("workspace_branch", {"snapshot_id": snap["snapshot_id"]})
    return called
