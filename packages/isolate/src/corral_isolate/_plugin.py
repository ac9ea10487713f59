"""Registers the ``isolate`` provider with corral's plugin system."""

from __future__ import annotations

from collections.abc import Callable

import corral
import corral.provider

from ._provider import SUPPORTED_CAPABILITIES, IsolateProvider

__all__ = ["corral_register_providers"]


@corral.hookimpl
def corral_register_providers(register: Callable[[corral.provider.ProviderSpec], None]) -> None:
    """Contribute the ``isolate`` provider."""
    register(
        corral.provider.ProviderSpec(
            kind="isolate",
            factory=IsolateProvider,
            # core's ``converter=frozenset`` leaves mypy with an unsolved TypeVar.
            capabilities=SUPPORTED_CAPABILITIES,
            summary="ephemeral JavaScript in a WebAssembly isolate (script only; no files)",
            distribution="corral-isolate",
        )
    )
