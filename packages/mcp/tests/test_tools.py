"""The workspace tools over MCP (stdio and streamable HTTP), against a real server process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

import corral

pytestmark = [
    pytest.mark.anyio,
    # The SDK's HTTP *client* (httpx2) drops its SSE async generators unclosed on
    # trio; that is client-side teardown noise, not a server defect.
    pytest.mark.filterwarnings(
        r"ignore:Exception ignored in. <async_generator object "
        r"(EventSource|PoolByteStream|Response)\.:pytest.PytestUnraisableExceptionWarning"
    ),
]


def text_of(result: Any) -> str:
    return "".join(block.text for block in result.content if block.type == "text")


TRANSPORTS = pytest.mark.parametrize("connect", ["stdio", "http"], indirect=True)
CALL_TIMEOUT_S = 30.0


@TRANSPORTS
async def test_tools_match_in_process(
    connect: Callable[[list[str]], Any], backend_args: list[str]
) -> None:
    async with corral.open_workspace("in-memory") as ws:
        expected = {t.name: (t.description, dict(t.parameters)) for t in ws.tools}
    async with connect(["--provider", "in-memory", *backend_args]) as client:
        with anyio.fail_after(CALL_TIMEOUT_S):
            listed = await client.list_tools()
    served = {t.name: (t.description, t.input_schema) for t in listed.tools}
    assert served == expected
    assert "workspace_read_file" in served


@TRANSPORTS
async def test_file_round_trip(
    connect: Callable[[list[str]], Any], backend_args: list[str]
) -> None:
    async with connect(["--provider", "in-memory", *backend_args]) as client:
        with anyio.fail_after(CALL_TIMEOUT_S):
            wrote = await client.call_tool(
                "workspace_write_file", {"path": "notes/a.txt", "content": "alpha\nbeta\n"}
            )
            assert not wrote.is_error, text_of(wrote)
            assert wrote.structured_content == {"path": "/notes/a.txt", "bytes_written": 11}

            edited = await client.call_tool(
                "workspace_edit_file",
                {"path": "notes/a.txt", "old_text": "beta", "new_text": "gamma"},
            )
            assert not edited.is_error, text_of(edited)

            read = await client.call_tool("workspace_read_file", {"path": "notes/a.txt"})
            assert not read.is_error
            assert text_of(read) == "alpha\ngamma\n"
            assert read.structured_content is not None
            assert read.structured_content["content"] == "alpha\ngamma\n"

            found = await client.call_tool("workspace_grep", {"pattern": "gam+a"})
            assert not found.is_error, text_of(found)
            assert "/notes/a.txt" in text_of(found)
            assert "alpha" not in text_of(found)


@TRANSPORTS
async def test_errors_are_clean_tool_errors(
    connect: Callable[[list[str]], Any], backend_args: list[str]
) -> None:
    async with connect(["--provider", "in-memory", *backend_args]) as client:
        with anyio.fail_after(CALL_TIMEOUT_S):
            bad_arg = await client.call_tool("workspace_read_file", {"pth": "a.txt"})
            escape = await client.call_tool("workspace_read_file", {"path": "../../etc/passwd"})
            missing = await client.call_tool("workspace_read_file", {"path": "nope.txt"})
            unknown = await client.call_tool("workspace_teleport", {})
            # The server is still serving after every error.
            ok = await client.call_tool("workspace_write_file", {"path": "x", "content": "1"})

    assert bad_arg.is_error
    assert "pth" in text_of(bad_arg)
    assert escape.is_error
    assert "escapes the workspace" in text_of(escape)
    assert missing.is_error
    assert "nope.txt" in text_of(missing)
    assert unknown.is_error
    assert "unknown tool" in text_of(unknown)
    for result in (bad_arg, escape, missing, unknown):
        assert "Traceback" not in text_of(result)
        assert result.structured_content is None
    assert escape.meta is not None
    assert escape.meta["corral/error_code"] == "invalid_path"
    assert not ok.is_error
