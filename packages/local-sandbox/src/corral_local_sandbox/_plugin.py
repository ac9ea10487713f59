"""Registers the ``local-sandbox`` provider with corral (entry point ``local-sandbox``)."""

from __future__ import annotations

from collections.abc import Callable

import corral
import corral.provider

from ._provider import LocalSandboxProvider

__all__ = ["corral_register_providers"]


def _bwrap_problem() -> str | None:
    """Cheap: bubblewrap found and able to create namespaces here (one ``bwrap true``)."""
    import subprocess
    import sys

    from ._detect import _resolve_bwrap

    if sys.platform != "linux":
        return None if sys.platform == "darwin" else "local-sandbox needs Linux or macOS"
    try:
        bwrap = _resolve_bwrap(None)
    except corral.WorkspaceFailedError as exc:
        return exc.message
    try:
        done = subprocess.run(
            [bwrap, "--unshare-all", "--ro-bind", "/", "/", "--", "true"],
            capture_output=True,
            timeout=5,
            check=False,
            env={"PATH": "/usr/bin:/bin"},
        )
    except (OSError, subprocess.SubprocessError):
        return "bubblewrap cannot be executed"
    if done.returncode != 0:
        return (
            "bubblewrap cannot create namespaces here (unprivileged user namespaces "
            "disabled, or inside a container without them)"
        )
    return None


@corral.hookimpl
def corral_register_providers(register: Callable[[corral.provider.ProviderSpec], None]) -> None:
    """Contribute the local-sandbox provider."""
    register(
        corral.provider.ProviderSpec(
            kind="local-sandbox",
            factory=LocalSandboxProvider,
            capabilities=LocalSandboxProvider.capabilities,
            summary="host tmpdir; every command in bubblewrap (Linux) or seatbelt (macOS), "
            "network off by default; fails closed",
            distribution="corral-local-sandbox",
            probe=_bwrap_problem,
            # bubblewrap + seccomp contain every command: shell syntax is not the risk there.
            policy_defaults={
                "shell": {"allow_shell_syntax": True},
                "process": {"allow_shell_syntax": True},
            },
        )
    )
