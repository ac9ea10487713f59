"""Shell tools over MCP with local-bash: commands run, and cancellation kills them."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.types.version import LATEST_HANDSHAKE_VERSION

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.usefixtures("require_local_bash"),
    # The SDK's HTTP *client* (httpx2) drops its SSE async generators unclosed on
    # trio; that is client-side teardown noise, not a server defect.
    pytest.mark.filterwarnings(
        r"ignore:Exception ignored in. <async_generator object "
        r"(EventSource|PoolByteStream|Response)\.:pytest.PytestUnraisableExceptionWarning"
    ),
]

SHELL_CAPS = json.dumps({"fs": True, "shell": {"allow_shell_syntax": True, "timeout_s": 300}})


def text_of(result: Any) -> str:
    return "".join(block.text for block in result.content if block.type == "text")


def processes_with(marker: str) -> list[int]:
    """Pids whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


async def wait_until(predicate: Any, timeout: float, what: str) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.1)


@pytest.mark.parametrize("connect", ["stdio", "http"], indirect=True)
async def test_run_command(connect: Any, backend_args: list[str]) -> None:
    async with connect(["--provider", "local-bash", *backend_args]) as client:
        with anyio.fail_after(60):
            wrote = await client.call_tool(
                "workspace_write_file", {"path": "f.txt", "content": "x"}
            )
            assert not wrote.is_error, text_of(wrote)
            ran = await client.call_tool("workspace_run", {"command": "cat f.txt"})
            failed = await client.call_tool("workspace_run", {"command": "ls no-such-file"})
    assert not ran.is_error, text_of(ran)
    assert ran.structured_content is not None
    assert ran.structured_content["stdout"] == "x"
    assert ran.structured_content["exit_code"] == 0
    assert failed.structured_content is not None
    assert failed.structured_content["exit_code"] != 0


def _sleeper() -> tuple[str, str]:
    """A command whose process tree (a background grandchild too) carries a unique marker."""
    marker = f"{random.randint(100000, 999999)}.25"
    return marker, f"sleep {marker} & sleep {marker}; wait"


async def test_stdio_disconnect_kills_running_command(
    server_env: dict[str, str], backend_args: list[str]
) -> None:
    """The host closes stdin mid-call (and does nothing else): the server must
    cancel the call, kill the command's tree and exit on its own."""
    marker, command = _sleeper()
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": LATEST_HANDSHAKE_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "workspace_run", "arguments": {"command": command}},
        },
    ]
    argv = [sys.executable, "-m", "corral._cli", "mcp", "--provider", "local-bash"]
    process = await anyio.open_process(
        [*argv, "--capabilities", SHELL_CAPS, *backend_args],
        env=server_env,
        stderr=None,
    )
    try:
        assert process.stdin is not None
        wire = "".join(json.dumps(m) + "\n" for m in messages).encode()
        await process.stdin.send(wire)
        await wait_until(lambda: len(processes_with(marker)) >= 2, 60, "command started")
        await process.stdin.aclose()
        await wait_until(lambda: not processes_with(marker), 30, "process tree killed")
        with anyio.fail_after(30):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.aclose()


async def test_http_cancelled_call_kills_running_command(launcher: Any) -> None:
    marker, command = _sleeper()
    async with launcher.http("--provider", "local-bash", "--capabilities", SHELL_CAPS) as (
        url,
        process,
    ):
        async with launcher.http_client(url) as client:
            with anyio.move_on_after(120) as scope:
                async with anyio.create_task_group() as tg:

                    async def call() -> None:
                        await client.call_tool("workspace_run", {"command": command})

                    tg.start_soon(call)
                    await wait_until(lambda: len(processes_with(marker)) >= 2, 60, "started")
                    tg.cancel_scope.cancel()
            assert not scope.cancelled_caught
            # The client sent notifications/cancelled; the server is still up.
            await wait_until(lambda: not processes_with(marker), 30, "process tree killed")
            with anyio.fail_after(60):
                ran = await client.call_tool("workspace_run", {"command": "echo still-here"})
            assert "still-here" in text_of(ran)
        assert process.returncode is None
