"""Registers the ``in-memory`` provider with corral's plugin system."""

from __future__ import annotations

from collections.abc import Callable

import corral
import corral.provider

from ._provider import SUPPORTED_CAPABILITIES, InMemoryProvider

__all__ = ["corral_register_providers"]


@corral.hookimpl
def corral_register_providers(register: Callable[[corral.provider.ProviderSpec], None]) -> None:
    """Contribute the ``in-memory`` provider."""
    register(
        corral.provider.ProviderSpec(
            kind="in-memory",
            factory=InMemoryProvider,
            # core's ``converter=frozenset`` leaves mypy with an unsolved TypeVar.
            capabilities=SUPPORTED_CAPABILITIES,
            summary="files and snapshots in process memory; for tests, demos, ephemeral agents",
            distribution="corral-memory",
            # Its workspaces live in this process's memory and die with it.
            outlives_process=False,
        )
    )
