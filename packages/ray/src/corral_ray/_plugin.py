"""Registers the ``ray`` provider with corral (entry point ``ray``).

Ray itself is imported only when a provider is built, so listing providers
(``corral providers``) stays fast.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import corral
import corral.provider

__all__ = ["corral_register_providers"]


def _factory(
    *,
    inner: str = "local-bash",
    inner_options: Mapping[str, Any] | None = None,
    placement: str | Mapping[str, Any] = "spread",
    address: str = "auto",
    max_workspaces_per_node: int = 256,
    min_free_memory_bytes: int = 0,
    open_timeout_s: float = 60.0,
    lease_s: float = 600.0,
) -> corral.provider.WorkspaceProvider:
    """Build a :class:`corral_ray.RayProvider` (see it for the options)."""
    from ._provider import RayProvider

    return RayProvider(
        inner=inner,
        inner_options=inner_options,
        placement=placement,
        address=address,
        max_workspaces_per_node=max_workspaces_per_node,
        min_free_memory_bytes=min_free_memory_bytes,
        open_timeout_s=open_timeout_s,
        lease_s=lease_s,
    )


@corral.hookimpl
def corral_register_providers(register: Callable[[corral.provider.ProviderSpec], None]) -> None:
    """Contribute the ``ray`` provider kind."""
    register(
        corral.provider.ProviderSpec(
            kind="ray",
            factory=_factory,
            # The inner provider decides; these are the three inner kinds' common set.
            capabilities=frozenset({"fs", "shell", "snapshot"}),
            summary="workspaces of an inner provider placed across a Ray cluster (node agents)",
            distribution="corral-ray",
        )
    )
