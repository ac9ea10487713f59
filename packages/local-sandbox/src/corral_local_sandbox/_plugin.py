"""Registers the ``local-sandbox`` provider with corral (entry point ``local-sandbox``)."""

from __future__ import annotations

from collections.abc import Callable

import corral

from ._provider import LocalSandboxProvider

__all__ = ["corral_register_providers"]


@corral.hookimpl
def corral_register_providers(register: Callable[[corral.ProviderSpec], None]) -> None:
    """Contribute the local-sandbox provider."""
    register(
        corral.ProviderSpec(
            kind="local-sandbox",
            factory=LocalSandboxProvider,
            capabilities=LocalSandboxProvider.capabilities,
            summary="host tmpdir; every command in bubblewrap (Linux) or seatbelt (macOS), "
            "network off by default; fails closed",
            distribution="corral-local-sandbox",
        )
    )
