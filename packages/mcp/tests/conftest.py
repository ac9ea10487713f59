"""Helpers: launch ``corral mcp`` as a real subprocess and talk to it with the SDK client."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

STARTUP_TIMEOUT_S = 60.0
"""Generous: the machine is shared, and the server imports every plugin."""


def _local_bash_available() -> bool:
    try:
        import corral_local_bash  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture
def require_local_bash() -> None:
    """Skip (with the reason) when the local-bash provider is not importable."""
    if not _local_bash_available():
        pytest.skip("corral-local-bash is not importable in this environment")


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """An isolated CORRAL_STATE_DIR for one test."""
    path = tmp_path / "state"
    path.mkdir()
    return path


@pytest.fixture
def server_env(state_dir: Path) -> dict[str, str]:
    """The environment a server subprocess runs with."""
    return {**os.environ, "CORRAL_STATE_DIR": str(state_dir)}


@pytest.fixture
def backend_args(anyio_backend: Any) -> list[str]:
    """Run the server on the test's own backend, so both are proven end to end."""
    name = anyio_backend if isinstance(anyio_backend, str) else anyio_backend[0]
    return ["--backend", name]


def mcp_command(*args: str) -> list[str]:
    """The argv of ``corral mcp ARGS``."""
    return [sys.executable, "-m", "corral._cli", "mcp", *args]


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def stdio_session(args: list[str], env: Mapping[str, str]) -> AsyncIterator[ClientSession]:
    """A ready client session with ``corral mcp ARGS`` over stdio."""
    params = StdioServerParameters(
        command=sys.executable, args=mcp_command(*args)[1:], env=dict(env)
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        with anyio.fail_after(STARTUP_TIMEOUT_S):
            await client.initialize()
        yield client


async def wait_for_port(port: int, process: anyio.abc.Process) -> None:
    """Until the server accepts connections (or fail if it died)."""
    with anyio.fail_after(STARTUP_TIMEOUT_S):
        while True:
            if process.returncode is not None:
                raise AssertionError(f"server exited early with status {process.returncode}")
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.1)
                continue
            await stream.aclose()
            return


@asynccontextmanager
async def http_server(
    args: list[str], env: Mapping[str, str]
) -> AsyncIterator[tuple[str, anyio.abc.Process]]:
    """``corral mcp ARGS --http 127.0.0.1:PORT`` running; yields its URL and process.

    On exit the server gets SIGTERM and must stop cleanly within the bound.
    """
    port = free_port()
    process = await anyio.open_process(
        mcp_command(*args, "--http", f"127.0.0.1:{port}"),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=None,
        stderr=None,
    )
    try:
        await wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            await process.wait()


@asynccontextmanager
async def http_session(url: str) -> AsyncIterator[ClientSession]:
    """A ready client session with the streamable HTTP server at ``url``."""
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as client:
        with anyio.fail_after(STARTUP_TIMEOUT_S):
            await client.initialize()
        yield client


class Launcher:
    """What tests use to start servers and connect clients (fixtures cannot be imported)."""

    def __init__(self, env: dict[str, str], backend_args: list[str]) -> None:
        self.env = env
        self.backend_args = backend_args

    def stdio(self, *args: str) -> Any:
        """A client session with ``corral mcp ARGS --backend B`` over stdio."""
        return stdio_session([*args, *self.backend_args], self.env)

    def http(self, *args: str) -> Any:
        """``corral mcp ARGS --backend B --http ...`` running: yields ``(url, process)``."""
        return http_server([*args, *self.backend_args], self.env)

    def http_client(self, url: str) -> Any:
        """A client session with the server at ``url``."""
        return http_session(url)

    @staticmethod
    def text(result: Any) -> str:
        """The text content of a tool result."""
        return "".join(block.text for block in result.content if block.type == "text")


@pytest.fixture
def launcher(server_env: dict[str, str], backend_args: list[str]) -> Launcher:
    """Starts ``corral mcp`` subprocesses on the test's backend with an isolated state dir."""
    return Launcher(server_env, backend_args)


@pytest.fixture
def connect(
    request: pytest.FixtureRequest, server_env: dict[str, str]
) -> Callable[[list[str]], Any]:
    """``connect(args)``: a client session over the transport the test is parametrised with."""
    transport = request.param

    @asynccontextmanager
    async def open_session(args: list[str]) -> AsyncIterator[ClientSession]:
        if transport == "stdio":
            async with stdio_session(args, server_env) as client:
                yield client
        else:
            async with http_server(args, server_env) as (url, _), http_session(url) as client:
                yield client

    return open_session
