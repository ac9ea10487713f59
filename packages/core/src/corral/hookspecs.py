"""Hook specifications of the ``corral`` plugin system.

A plugin is a module or object with functions marked ``@corral.hookimpl``,
published through the ``corral`` entry-point group::

    [project.entry-points.corral]
    my-provider = "my_package._plugin"

Every hook receives a ``register`` callback (the llm/pluggy "registration by
callback" style). Core's own capabilities are registered through exactly
these hooks. Hooks are called once, when :func:`corral.load_plugins` builds
the plugin set; none is ``firstresult``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import pluggy

if TYPE_CHECKING:
    from ._capabilities import AnyCapability
    from ._plugins import CliCommand, ProviderSpec

__all__ = [
    "NAME",
    "corral_register_capabilities",
    "corral_register_commands",
    "corral_register_providers",
    "hookimpl",
    "hookspec",
]

NAME: Final = "corral"
"""The project name: marker name, plugin manager name and entry-point group."""

hookspec: Final = pluggy.HookspecMarker(NAME)
hookimpl: Final = pluggy.HookimplMarker(NAME)


@hookspec
def corral_register_providers(register: Callable[[ProviderSpec], None]) -> None:
    """Contribute workspace providers.

    Called once per plugin set. Call ``register(ProviderSpec(...))`` for each
    provider kind the plugin offers; registering a kind twice is an error
    naming both.

    Args:
        register: Accepts a :class:`corral.provider.ProviderSpec`.
    """


@hookspec
def corral_register_capabilities(register: Callable[[AnyCapability], None]) -> None:
    """Contribute capabilities: a name, a policy class, a module and tools.

    Called once per plugin set, core's built-ins (fs, shell, code, script,
    snapshot) included. Tool names must start with ``workspace_``.

    Args:
        register: Accepts a :class:`corral.capability.Capability`.
    """


@hookspec
def corral_register_commands(register: Callable[[CliCommand], None]) -> None:
    """Contribute ``corral`` CLI subcommands (``corral docker gc``, ``corral mcp``...).

    Args:
        register: Accepts a :class:`corral.provider.CliCommand`.
    """
