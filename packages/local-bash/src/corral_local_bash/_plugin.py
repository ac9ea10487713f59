"""Registers the local-bash provider with corral (entry point ``local-bash``)."""

from __future__ import annotations

from collections.abc import Callable

import corral
import corral.provider

from ._provider import LocalBashProvider

__all__ = ["corral_register_providers"]


@corral.hookimpl
def corral_register_providers(register: Callable[[corral.provider.ProviderSpec], None]) -> None:
    """Contribute the ``local-bash`` provider kind."""
    register(
        corral.provider.ProviderSpec(
            kind="local-bash",
            factory=LocalBashProvider,
            # attrs' converter=frozenset types the field as a generic Iterable.
            capabilities=frozenset({"fs", "shell", "code", "process", "snapshot"}),
            summary="host tmpdir + subprocess shell; no isolation, trusted code only",
            distribution="corral-local-bash",
        )
    )
