"""The light part of corral-mcp: defaults and address checks, importable without the SDK.

The ``corral`` plugin loads this (and the command's argument parser) at every
CLI start; the MCP SDK itself is imported only when a server actually runs.
"""

from __future__ import annotations

import ipaddress
from typing import Final

from corral import ConfigError
from corral.capability import echo_if_short

__all__ = [
    "DEFAULT_HTTP_PATH",
    "DEFAULT_SERVER_NAME",
    "REMOTE_WARNING",
    "check_bind_host",
    "parse_http_address",
]

DEFAULT_HTTP_PATH: Final = "/mcp"
DEFAULT_SERVER_NAME: Final = "corral"

REMOTE_WARNING: Final = (
    "the MCP endpoint has no authentication: anyone who can reach it can read and "
    "write the workspace and run commands in it"
)


def check_bind_host(host: str, *, allow_remote: bool = False) -> str:
    """The IP address to bind for ``host``, refusing non-loopback ones unless allowed.

    Args:
        host: An IP address, or ``localhost`` (taken as 127.0.0.1).
        allow_remote: Accept an address other hosts can reach.

    Raises:
        ConfigError: Not an IP address, or not loopback without ``allow_remote``.
    """
    address = "127.0.0.1" if host == "localhost" else host.strip("[]")
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        shown = echo_if_short(host)
        raise ConfigError(f"HTTP host {shown!r} is not an IP address or 'localhost'") from None
    if not ip.is_loopback and not allow_remote:
        raise ConfigError(
            f"refusing to serve MCP on non-loopback address {address}: {REMOTE_WARNING}; "
            "pass --allow-remote (allow_remote=True) to do it anyway"
        )
    return str(ip)


def parse_http_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as a host and a port.

    Raises:
        ConfigError: Not of that shape, or the port is out of range.
    """
    host, sep, port_text = text.rpartition(":")
    shown = echo_if_short(text, limit=80)
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"--http expects HOST:PORT, e.g. 127.0.0.1:8765 (got {shown!r})")
    if host.startswith("[") != host.endswith("]"):
        raise ConfigError(f"--http: unbalanced brackets in {shown!r}")
    return host.strip("[]"), int(port_text)
