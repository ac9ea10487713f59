"""Entry point of corral-docker: the ``docker`` provider and ``corral docker gc``."""

from __future__ import annotations

from collections.abc import Callable

import corral
import corral.provider

from ._gc import gc_command
from ._provider import DockerProvider

__all__ = ["corral_register_commands", "corral_register_providers"]


def _daemon_problem() -> str | None:
    from ._sdk import daemon_problem  # the docker SDK loads only when asked

    return daemon_problem()


@corral.hookimpl
def corral_register_providers(register: Callable[[corral.provider.ProviderSpec], None]) -> None:
    """Register the ``docker`` provider."""
    register(
        corral.provider.ProviderSpec(
            kind="docker",
            factory=DockerProvider,
            # The SDK engine every docker:// / ssh:// URL gets attaches exec streams.
            capabilities=DockerProvider.capabilities | {"process", "code", "script"},
            summary="hardened per-session Docker containers (local or ssh:// engines)",
            distribution="corral-docker",
            probe=_daemon_problem,
            # The container is the boundary: shell syntax is not the risk there.
            policy_defaults={
                "shell": {"allow_shell_syntax": True},
                "process": {"allow_shell_syntax": True},
            },
        )
    )


@corral.hookimpl
def corral_register_commands(register: Callable[[corral.provider.CliCommand], None]) -> None:
    """Register ``corral docker gc [--dry-run]``."""
    register(gc_command())
