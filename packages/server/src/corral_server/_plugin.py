"""The ``corral`` entry point of corral-server: contributes ``corral serve`` and ``corral ws``."""

from __future__ import annotations

from collections.abc import Callable

import corral
import corral.capability

from ._cli import SERVE_COMMAND, WS_COMMAND

__all__ = ["corral_register_commands"]


@corral.hookimpl
def corral_register_commands(register: Callable[[corral.capability.CliCommand], None]) -> None:
    """Register ``corral serve`` and ``corral ws``."""
    register(SERVE_COMMAND)
    register(WS_COMMAND)
