"""The library API: public surface, conversions, address checks, in-process HTTP serving."""

from __future__ import annotations

import ipaddress
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

import corral
import corral_mcp

HTTP_CLIENT_NOISE = pytest.mark.filterwarnings(
    # The SDK's HTTP *client* (httpx2) drops its SSE async generators unclosed on
    # trio; that is client-side teardown noise, not a server defect.
    r"ignore:Exception ignored in. <async_generator object "
    r"(EventSource|PoolByteStream|Response)\.:pytest.PytestUnraisableExceptionWarning"
)


def test_public_surface() -> None:
    assert sorted(corral_mcp.__all__) == [
        "DEFAULT_HTTP_PATH",
        "DEFAULT_SERVER_NAME",
        "MCP_COMMAND",
        "build_server",
        "check_bind_host",
        "parse_http_address",
        "serve_http",
        "serve_stdio",
        "to_call_result",
        "to_mcp_tool",
    ]
    for name in corral_mcp.__all__:
        assert getattr(corral_mcp, name) is not None


def test_plugin_registers_the_command() -> None:
    plugins = corral.load_plugins()
    assert plugins.commands["mcp"] is corral_mcp.MCP_COMMAND


@pytest.mark.parametrize(
    ("data", "structured"),
    [
        ({"a": 1}, {"a": 1}),
        ([1, 2], {"result": [1, 2]}),
        ("text", {"result": "text"}),
        (None, None),
    ],
)
def test_call_result_shapes(data: Any, structured: Any) -> None:
    result = corral_mcp.to_call_result(corral.ToolResult("shown", data=data))
    assert result.is_error is False
    assert [c.text for c in result.content if c.type == "text"] == ["shown"]
    assert result.structured_content == structured


def test_error_result_carries_only_the_message() -> None:
    result = corral_mcp.to_call_result(
        corral.ToolResult("no such file: a", is_error=True, data={"x": 1}, error_code="not_found")
    )
    assert result.is_error is True
    assert result.structured_content is None
    assert [c.text for c in result.content if c.type == "text"] == ["no such file: a"]
    assert result.meta == {"corral/error_code": "not_found"}


@settings(max_examples=75, deadline=None)
@given(st.ip_addresses())
def test_only_loopback_binds_without_allow_remote(ip: Any) -> None:
    host = str(ip)
    if ip.is_loopback:
        assert corral_mcp.check_bind_host(host) == host
    else:
        with pytest.raises(corral.ConfigError, match="allow-remote"):
            corral_mcp.check_bind_host(host)
    assert corral_mcp.check_bind_host(host, allow_remote=True) == host


def test_localhost_means_ipv4_loopback() -> None:
    assert corral_mcp.check_bind_host("localhost") == "127.0.0.1"
    with pytest.raises(corral.ConfigError, match="not an IP address"):
        corral_mcp.check_bind_host("example.com", allow_remote=True)


@settings(max_examples=75, deadline=None)
@given(st.ip_addresses(), st.integers(0, 65535))
def test_http_address_round_trip(ip: Any, port: int) -> None:
    host = f"[{ip}]" if isinstance(ip, ipaddress.IPv6Address) else str(ip)
    assert corral_mcp.parse_http_address(f"{host}:{port}") == (str(ip), port)


@pytest.mark.parametrize("text", ["", "8765", "host:", ":80", "h:99999", "[::1:80", "h:-1"])
def test_bad_http_addresses(text: str) -> None:
    with pytest.raises(corral.ConfigError):
        corral_mcp.parse_http_address(text)


async def _raw_http(port: int, request: bytes) -> bytes:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(request)
        data = b""
        with anyio.move_on_after(10):
            while True:
                try:
                    data += await stream.receive()
                except anyio.EndOfStream:
                    break
        return data


@pytest.mark.anyio
@HTTP_CLIENT_NOISE
async def test_serve_http_in_process() -> None:
    async with corral.open_workspace("in-memory") as ws, anyio.create_task_group() as tg:
        host, port = await tg.start(corral_mcp.serve_http, ws, "127.0.0.1", 0)
        assert host == "127.0.0.1"
        assert port > 0
        url = f"http://127.0.0.1:{port}/mcp"
        with anyio.fail_after(30):
            async with (
                streamable_http_client(url) as (read, write),
                ClientSession(read, write) as client,
            ):
                await client.initialize()
                wrote = await client.call_tool(
                    "workspace_write_file", {"path": "in.txt", "content": "proc"}
                )
                assert not wrote.is_error
            # The server wrote into the caller's own workspace.
            read_back = await ws.call("workspace_read_file", {"path": "in.txt"})
            assert read_back.content == "proc"

            rebinding = await _raw_http(
                port,
                b"POST /mcp HTTP/1.1\r\nHost: evil.example:80\r\nContent-Type: application/json\r\n"
                b"Content-Length: 2\r\nConnection: close\r\n\r\n{}",
            )
            assert rebinding.startswith((b"HTTP/1.1 421", b"HTTP/1.1 403"))

            garbage = await _raw_http(port, b"NOT HTTP AT ALL\r\n\r\n")
            assert garbage.startswith(b"HTTP/1.1 400")

            other = await _raw_http(
                port, b"GET /elsewhere HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            )
            assert other.startswith(b"HTTP/1.1 404")
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_serve_http_refuses_remote_before_binding() -> None:
    async with corral.open_workspace("in-memory") as ws:
        with pytest.raises(corral.ConfigError, match="no authentication"):
            await corral_mcp.serve_http(ws, "0.0.0.0", 0)
