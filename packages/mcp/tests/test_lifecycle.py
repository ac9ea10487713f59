"""Sessions across server restarts, graceful shutdown, and command-line refusals."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral import RefStore

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


def store(state_dir: Path) -> RefStore:
    return RefStore(state_dir / "sessions.sqlite3")


@pytest.mark.usefixtures("require_local_bash")
async def test_restart_resumes_kept_session(launcher: Any, state_dir: Path) -> None:
    async with launcher.stdio("--provider", "local-bash", "--session", "s1", "--keep") as client:
        with anyio.fail_after(60):
            wrote = await client.call_tool(
                "workspace_write_file", {"path": "keep.txt", "content": "survives"}
            )
        assert not wrote.is_error, text_of(wrote)
    stored = await store(state_dir).load("s1")
    assert stored is not None
    assert stored.ref is not None
    assert stored.provider_kind == "local-bash"

    # No --provider: the stored session says which one. No --keep: closed on exit.
    async with launcher.stdio("--session", "s1") as client:
        with anyio.fail_after(60):
            read = await client.call_tool("workspace_read_file", {"path": "keep.txt"})
    assert not read.is_error, text_of(read)
    assert text_of(read) == "survives"
    assert await store(state_dir).load("s1") is None


@pytest.mark.usefixtures("require_local_bash")
@pytest.mark.parametrize("keep", [False, True])
async def test_sigterm_over_http_shuts_down_cleanly(
    launcher: Any, state_dir: Path, keep: bool
) -> None:
    args = ["--provider", "local-bash", "--session", "h1", *(["--keep"] if keep else [])]
    async with launcher.http(*args) as (url, process):
        async with launcher.http_client(url) as client:
            with anyio.fail_after(60):
                wrote = await client.call_tool(
                    "workspace_write_file", {"path": "a", "content": "1"}
                )
            assert not wrote.is_error
        assert (await store(state_dir).load("h1")) is not None
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await process.wait() == 0
    stored = await store(state_dir).load("h1")
    assert (stored is not None) == keep


async def test_sigterm_with_stdin_open_closes_workspace(
    server_env: dict[str, str], backend_args: list[str], state_dir: Path
) -> None:
    """A host that signals without closing stdin first must not hang the server."""
    argv = [sys.executable, "-m", "corral._cli", "mcp", "--provider", "in-memory"]
    process = await anyio.open_process(
        [*argv, "--session", "t1", *backend_args], env=server_env, stderr=subprocess.PIPE
    )
    try:
        assert process.stderr is not None
        with anyio.fail_after(60):
            banner = b""
            while b"serving MCP" not in banner:
                banner += await process.stderr.receive()
        assert (await store(state_dir).load("t1")) is not None
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await process.wait() == 0
        assert (await store(state_dir).load("t1")) is None
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.aclose()


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral._cli", "mcp", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--http", "0.0.0.0:8765"], "--allow-remote"),
        (["--http", "8765"], "HOST:PORT"),
        (["--http", "example.com:80"], "not an IP address"),
        (["--allow-remote"], "only applies with --http"),
        (["--capabilities", "{nope"], "not valid JSON"),
        (["--provider", "no-such-kind"], "unknown provider kind"),
    ],
)
def test_cli_refusals(server_env: dict[str, str], args: list[str], message: str) -> None:
    done = run_cli(*args, env=server_env)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_help_explains_remote_risk(server_env: dict[str, str]) -> None:
    done = run_cli("--help", env=server_env)
    assert done.returncode == 0
    flat = " ".join(done.stdout.split())
    assert "--allow-remote" in flat
    assert "no authentication" in flat


def test_resume_of_vanished_workspace_fails_cleanly(
    server_env: dict[str, str], state_dir: Path
) -> None:
    # in-memory workspaces die with their process: a stored ref to one cannot resume.
    from corral import WorkspaceRef

    ref = WorkspaceRef(provider_id="in-memory", payload={"bogus": True}, capabilities=["fs"])
    anyio.run(lambda: store(state_dir).save("gone", "in-memory", ref, capabilities={"fs": True}))
    done = run_cli("--session", "gone", env=server_env)
    assert done.returncode == 1, done.stderr
    assert "cannot resume session 'gone'" in done.stderr
    assert "corral close --session gone" in done.stderr
    assert "bogus" not in done.stderr
    assert json.dumps({"bogus": True}) not in done.stderr
