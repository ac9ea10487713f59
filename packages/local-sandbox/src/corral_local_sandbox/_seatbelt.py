"""The macOS backend: a ``sandbox-exec`` (seatbelt) profile generated from the same policy.

The profile text is constant for a given policy shape; every path enters as
a ``-D NAME=VALUE`` parameter and is referenced with ``(param "NAME")``, so
no path is ever spliced into SBPL source (no quoting bugs, no injection).
Paths are canonical (``/private/var/...``, not ``/var/...``): seatbelt
matches the resolved path. In SBPL a later rule overrides an earlier one,
which the deny-after-allow ordering below relies on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Final

import attrs

from corral_posix import WrapContext, WrappedCommand

from ._policy import SandboxPolicy

__all__ = ["SANDBOX_EXEC", "SeatbeltWrapper", "seatbelt_params", "seatbelt_profile"]

SANDBOX_EXEC: Final = "/usr/bin/sandbox-exec"

_MACH_SERVICES: Final = (
    "com.apple.system.opendirectoryd.libinfo",
    "com.apple.system.notification_center",
    "com.apple.system.logger",
    "com.apple.logd",
    "com.apple.SecurityServer",
    "com.apple.trustd.agent",
)

_BASE: Final = """(version 1)
(deny default)
(allow process-exec)
(allow process-fork)
(allow signal (target same-sandbox))
(allow process-info* (target same-sandbox))
(allow sysctl-read)
(allow ipc-posix-shm)
(allow ipc-posix-sem)
(allow file-read*)
(deny file-read* (subpath (param "HOST_HOME")))
(allow file-read* (subpath (param "WORKSPACE")) (subpath (param "TMPDIR")))
(allow file-write* (subpath (param "WORKSPACE")) (subpath (param "TMPDIR")))
(allow file-write-data (literal "/dev/null") (literal "/dev/zero"))
"""


def _protected_params(policy: SandboxPolicy, workspace: str) -> tuple[list[str], list[str]]:
    """Canonical protected paths and their ancestors (the workspace root included)."""
    paths: list[str] = []
    ancestors: list[str] = [workspace]
    for entry in policy.protected_paths:
        parts = entry.path.split("/")
        paths.append("/".join([workspace, *parts]))
        for depth in range(1, len(parts)):
            candidate = "/".join([workspace, *parts[:depth]])
            if candidate not in ancestors:
                ancestors.append(candidate)
    return paths, ancestors


def seatbelt_profile(policy: SandboxPolicy) -> str:
    """The SBPL profile for ``policy`` (paths come from :func:`seatbelt_params`).

    Args:
        policy: The sandbox policy.

    Returns:
        Profile text for ``sandbox-exec -p``.
    """
    lines = [_BASE.rstrip("\n")]
    services = " ".join(f'(global-name "{name}")' for name in _MACH_SERVICES)
    lines.append(f"(allow mach-lookup {services})")
    count = len(policy.protected_paths)
    ancestors = len(_protected_params(policy, "/w")[1])
    if count:
        refs = " ".join(f'(subpath (param "PROTECTED_{i}"))' for i in range(count))
        lines.append(f"(deny file-write* {refs})")
    # Renaming or deleting an ancestor would let a fresh copy replace the path.
    refs = " ".join(f'(literal (param "ANCESTOR_{i}"))' for i in range(ancestors))
    lines.append(f"(deny file-write-unlink {refs})")
    if policy.network.mode == "on":
        lines += [
            "(allow network-outbound)",
            "(allow network-inbound)",
            "(allow system-socket)",
            '(allow mach-lookup (global-name "com.apple.dnssd.service"))',
        ]
    return "\n".join(lines) + "\n"


def seatbelt_params(
    policy: SandboxPolicy, *, workspace: str, tmpdir: str, host_home: str
) -> dict[str, str]:
    """The ``-D`` parameters of :func:`seatbelt_profile`, with canonical paths.

    Args:
        policy: The sandbox policy.
        workspace: Host path of the workspace.
        tmpdir: The command's private temp directory.
        host_home: The host user's home, denied for reading.
    """
    ws = os.path.realpath(workspace)
    params = {
        "WORKSPACE": ws,
        "TMPDIR": os.path.realpath(tmpdir),
        "HOST_HOME": os.path.realpath(host_home),
    }
    paths, ancestors = _protected_params(policy, ws)
    params.update({f"PROTECTED_{i}": p for i, p in enumerate(paths)})
    params.update({f"ANCESTOR_{i}": p for i, p in enumerate(ancestors)})
    return params


def _ulimit_script(policy: SandboxPolicy) -> str:
    # macOS enforces neither RLIMIT_AS nor RLIMIT_RSS; -f counts 512-byte blocks in POSIX sh.
    lim = policy.limits
    opts = []
    if lim.processes is not None:
        opts.append(f"ulimit -u {lim.processes}")
    if lim.cpu_seconds is not None:
        opts.append(f"ulimit -t {lim.cpu_seconds}")
    if lim.file_size_bytes is not None:
        opts.append(f"ulimit -f {max(1, lim.file_size_bytes // 512)}")
    if lim.open_files is not None:
        opts.append(f"ulimit -n {lim.open_files}")
    opts.append("ulimit -c 0")
    return " && ".join(opts) + ' && exec "$@"'


@attrs.frozen
class SeatbeltWrapper:
    """A CommandWrapper running each command under ``sandbox-exec``.

    Attributes:
        policy: The sandbox policy.
        tmpdir: Private temp directory of the workspace (also its HOME).
        host_home: The host home directory to hide.
        sandbox_exec: Path of ``sandbox-exec``.
    """

    policy: SandboxPolicy
    tmpdir: str
    host_home: str
    sandbox_exec: str = SANDBOX_EXEC

    def wrap(self, argv: Sequence[str], ctx: WrapContext) -> WrappedCommand:
        """Return ``sandbox-exec -p PROFILE -D ... -- sh -c ULIMITS argv``."""
        params = seatbelt_params(
            self.policy, workspace=ctx.root, tmpdir=self.tmpdir, host_home=self.host_home
        )
        defines: list[str] = []
        for key, value in params.items():
            defines += ["-D", f"{key}={value}"]
        launch = [
            self.sandbox_exec,
            "-p",
            seatbelt_profile(self.policy),
            *defines,
            "/bin/sh",
            "-c",
            _ulimit_script(self.policy),
            "corral-sandbox",
            *argv,
        ]
        return WrappedCommand(argv=tuple(launch), env=_env(ctx.env, self.tmpdir))


def _env(env: Mapping[str, str], tmpdir: str) -> dict[str, str]:
    out = dict(env)
    out.update(HOME=tmpdir, TMPDIR=tmpdir)
    return out
