"""The ``corral`` entry point of corral-mcp: contributes the ``corral mcp`` subcommand."""

from __future__ import annotations

from collections.abc import Callable

import corral
import corral.capability

from ._command import MCP_COMMAND

__all__ = ["corral_register_commands"]


@corral.hookimpl
def corral_register_commands(register: Callable[[corral.capability.CliCommand], None]) -> None:
    """Register ``corral mcp``."""
    register(MCP_COMMAND)
