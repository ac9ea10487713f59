"""``corral mcp --workspace ID``: a durable workspace's tools, through the official MCP client.

A real ``corral serve`` (local-bash with its process module) and a real
``corral mcp`` subprocess over stdio; the SDK's client lists and calls tools,
and what the tools did is read back from a version of the durable workspace
after the MCP session ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from server_support import Box

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SHELL = {"fs": True, "shell": {"allow_shell_syntax": True}, "process": True}


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    """A running ``corral serve`` (restartable) with its client."""
    b = Box(tmp_path)
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _env(box: Box, token: str | None = None) -> dict[str, str]:
    assert box.server is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_SERVER")}
    env["CORRAL_SERVER_URL"] = box.server.url
    env["CORRAL_SERVER_TOKEN"] = token or (box.data / "token").read_text().strip()
    return env


@asynccontextmanager
async def _mcp(args: list[str], env: dict[str, str]) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "corral._cli", "mcp", *args], env=env
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        with anyio.fail_after(60):
            await client.initialize()
        yield client


def _text(result: Any) -> str:
    return "".join(block.text for block in result.content if block.type == "text")


async def test_tools_act_on_the_durable_workspace(box: Box, anyio_backend: str) -> None:
    c = box.client
    wid = c.create({"provider": "local-bash", "capabilities": ["fs", "shell", "process"]})["id"]
    args = ["--workspace", wid, "--capabilities", json.dumps(SHELL), "--backend", anyio_backend]
    async with _mcp(args, _env(box)) as client:
        with anyio.fail_after(120):
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"workspace_write_file", "workspace_read_file", "workspace_run"} <= names
            assert {"workspace_start_process", "workspace_read_process_output"} <= names
            wrote = await client.call_tool(
                "workspace_write_file", {"path": "src/app.py", "content": "x = 1\n"}
            )
            assert not wrote.is_error, _text(wrote)
            read = await client.call_tool("workspace_read_file", {"path": "src/app.py"})
            assert "x = 1" in _text(read)
            ran = await client.call_tool(
                "workspace_run", {"command": "cat src/app.py && echo made > out.txt"}
            )
            assert not ran.is_error, _text(ran)
            assert ran.structured_content is not None
            assert ran.structured_content["stdout"] == "x = 1\n"
            assert ran.structured_content["exit_code"] == 0
            missing = await client.call_tool("workspace_read_file", {"path": "nope.txt"})
            assert missing.is_error
            # The client's policy travels with the command and the box's guard enforces it.
            refused = await client.call_tool(
                "workspace_start_process", {"command": "echo a; echo b"}
            )
            assert refused.is_error
            assert (refused.meta or {}).get("corral/error_code") == "policy_denied"
            started = await client.call_tool(
                "workspace_start_process", {"command": "echo from-a-handle"}
            )
            assert not started.is_error, _text(started)
            assert started.structured_content is not None
            pid = started.structured_content["process_id"]
            out = ""
            while "from-a-handle" not in out:
                got = await client.call_tool(
                    "workspace_read_process_output", {"process_id": pid, "wait_s": 1.0}
                )
                assert not got.is_error, _text(got)
                out += _text(got)
    # The MCP session is over; the durable workspace still holds what the tools did.
    version = c.stop(wid)["version_id"]
    assert version is not None
    assert c.read_file(wid, "src/app.py") == b"x = 1\n"
    assert c.read_file(wid, "out.txt") == b"made\n"
    # ... and the handle the shell tool used is the workspace's record too.
    assert any(
        h["command"].startswith("cat src/app.py")
        for h in c.request("GET", f"/v1/workspaces/{wid}/handles")["handles"]
    )


def _mcp_fails(box: Box, args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "corral._cli", "mcp", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0, done.stderr
    return done.stderr


def test_bad_token_and_bad_id_are_clear_errors(box: Box) -> None:
    wid = box.client.create({"provider": "local-bash", "capabilities": ["fs"]})["id"]
    secret = "crl_" + "Z" * 43
    err = _mcp_fails(box, ["--workspace", wid], _env(box, token=secret))
    assert "refused the token" in err
    assert secret not in err
    other = "ws-" + "0" * 32
    err = _mcp_fails(box, ["--workspace", other], _env(box))
    assert "no such workspace" in err
    err = _mcp_fails(box, ["--workspace", "../etc/passwd"], _env(box))
    assert "not a valid id" in err
    assert "passwd" not in err
