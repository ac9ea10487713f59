"""The sandbox policy: network, resource limits and protected paths.

One policy object feeds both backends (bubblewrap on Linux, seatbelt on
macOS), so the two cannot drift on what "network off" or "protected" means.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal

import attrs

__all__ = [
    "DEFAULT_PROTECTED_PATHS",
    "SANDBOX_HOME",
    "SANDBOX_ROOT",
    "NetworkPolicy",
    "ProtectedPath",
    "SandboxLimits",
    "SandboxPolicy",
]

SANDBOX_ROOT: Final = "/workspace"
"""Where the workspace appears inside the Linux sandbox (stable across commands)."""

SANDBOX_HOME: Final = "/home/sandbox"
"""The private, empty home directory of sandboxed commands."""

NetworkMode = Literal["off", "on"]


@attrs.frozen
class NetworkPolicy:
    """What sandboxed commands may reach on the network.

    Attributes:
        mode: ``"off"`` (default): a private network namespace with only a
            loopback interface, so neither the host's ``127.0.0.1`` nor the
            internet is reachable. ``"on"``: the host's network.

    A host allowlist would be a third mode (``"allowlist"`` plus an
    ``allow`` field naming hosts) enforced by a proxy outside the sandbox;
    the frozen, keyword-built shape leaves room for it.
    """

    mode: NetworkMode = "off"

    def __attrs_post_init__(self) -> None:
        if self.mode not in ("off", "on"):
            raise ValueError("network must be 'off' or 'on'")

    @classmethod
    def coerce(cls, value: object) -> NetworkPolicy:
        """Accept a policy, ``"off"``/``"on"``, or ``{"mode": ...}``.

        Raises:
            ValueError: Anything else.
        """
        if isinstance(value, NetworkPolicy):
            return value
        if isinstance(value, str):
            return cls(value)  # type: ignore[arg-type]
        if isinstance(value, Mapping) and set(value) == {"mode"}:
            return cls(value["mode"])
        raise ValueError("network must be 'off', 'on' or {'mode': 'off'|'on'}")


def _positive_or_none(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"limit {attr.name} must be a positive integer or None")


@attrs.frozen(kw_only=True)
class SandboxLimits:
    """Resource limits of one workspace's commands.

    ``None`` lifts a limit. ``memory_bytes``, ``processes`` and
    ``disk_bytes`` bound the *workspace* (all its commands together), not
    one process: memory and processes through a cgroup per workspace
    (``memory_bytes`` needs one, and ``open`` fails with advice when none
    can be made; ``processes`` falls back to ``RLIMIT_NPROC`` inside the
    sandbox's user namespace for a non-root host user), the disk through a
    walk after each command. The other rlimits are per process, set on the
    launcher by the shell's supervisor and inherited through bwrap.

    Attributes:
        processes: Processes and threads (``pids.max`` / ``RLIMIT_NPROC``).
        memory_bytes: Memory of all the workspace's processes together, swap
            included where the kernel accounts it (cgroup ``memory.max`` /
            ``memory.limit_in_bytes``); tmpfs pages they write count too.
        cpu_seconds: CPU time of each process (``RLIMIT_CPU``).
        file_size_bytes: Largest file a command can write (``RLIMIT_FSIZE``,
            never above ``disk_bytes``).
        open_files: Open file descriptors per process (``RLIMIT_NOFILE``).
        tmpfs_bytes: Size of each private tmpfs (``/tmp``, home).
        disk_bytes: Disk space of the workspace (default 2 GiB: a sizeable
            checkout with its dependencies, far below a host disk). Measured
            after each command; over it, commands and file writes are
            refused until files are removed.
    """

    processes: int | None = attrs.field(default=256, validator=_positive_or_none)
    memory_bytes: int | None = attrs.field(default=4 * 1024**3, validator=_positive_or_none)
    cpu_seconds: int | None = attrs.field(default=300, validator=_positive_or_none)
    file_size_bytes: int | None = attrs.field(default=1024**3, validator=_positive_or_none)
    open_files: int | None = attrs.field(default=1024, validator=_positive_or_none)
    tmpfs_bytes: int | None = attrs.field(default=256 * 1024**2, validator=_positive_or_none)
    disk_bytes: int | None = attrs.field(default=2 * 1024**3, validator=_positive_or_none)

    @classmethod
    def coerce(cls, value: object) -> SandboxLimits:
        """Accept limits, ``None`` (defaults) or a mapping of field overrides.

        Raises:
            ValueError: Unknown keys or bad values.
        """
        if value is None:
            return cls()
        if isinstance(value, SandboxLimits):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(attrs.fields_dict(cls)))
            if unknown:
                raise ValueError(f"unknown limits: {', '.join(map(str, unknown))}")
            return cls(**value)
        raise ValueError("limits must be a mapping of limit names to integers")

    def effective_file_size(self) -> int | None:
        """``RLIMIT_FSIZE``: no single file may be larger than the whole disk quota."""
        sizes = [v for v in (self.file_size_bytes, self.disk_bytes) if v is not None]
        return min(sizes) if sizes else None

    def prlimit_args(self) -> list[str]:
        """``prlimit`` options setting soft and hard limits (no core dumps)."""
        pairs = [
            ("nproc", self.processes),
            ("cpu", self.cpu_seconds),
            ("fsize", self.effective_file_size()),
            ("nofile", self.open_files),
            ("core", 0),
        ]
        return [f"--{name}={value}:{value}" for name, value in pairs if value is not None]


@attrs.frozen
class ProtectedPath:
    """A workspace-relative path sandboxed commands may read but never write or create.

    Attributes:
        path: Relative path with ``/`` separators, no ``..``.
        is_dir: Whether it names a directory (the seatbelt profile and the
            file tools treat everything beneath it as protected too).
    """

    path: str
    is_dir: bool = False

    def __attrs_post_init__(self) -> None:
        parts = self.path.split("/")
        if (
            not self.path
            or self.path.startswith("/")
            or "\x00" in self.path
            or any(p in ("", ".", "..") for p in parts)
        ):
            raise ValueError("a protected path is a relative path without '.' or '..' parts")


def _p(path: str, is_dir: bool = False) -> ProtectedPath:
    return ProtectedPath(path, is_dir)


# Each entry is something a tool on the *host* may later execute or obey when a
# person opens the workspace (git, a shell, an editor, an agent client): a
# sandboxed command that could plant one would escape through that person.
DEFAULT_PROTECTED_PATHS: Final[tuple[ProtectedPath, ...]] = (
    # VCS: hooks run on commit/checkout; config can name fsmonitor, pager,
    # sshCommand, filters; .gitmodules names URLs fetched on update.
    _p(".git/hooks", True),
    _p(".git/config"),
    _p(".git/info", True),
    # A worktree's commondir names the directory git takes hooks and config from.
    _p(".git/commondir"),
    _p(".gitmodules"),
    _p(".hg/hgrc"),
    # Shell start-up files and direnv, sourced when the tree is a home or cwd.
    _p(".bashrc"),
    _p(".bash_profile"),
    _p(".bash_login"),
    _p(".profile"),
    _p(".zshrc"),
    _p(".zshenv"),
    _p(".zprofile"),
    _p(".envrc"),
    # Editor task, launch and settings files (VS Code tasks can run on folder open).
    _p(".vscode", True),
    _p(".idea", True),
    # Agent/MCP client configuration: servers and hooks they start.
    _p(".mcp.json"),
    _p(".cursor", True),
    _p(".claude", True),
)
"""The default protected set; see the package README for the reasoning."""


@attrs.frozen(kw_only=True)
class SandboxPolicy:
    """Everything the sandbox enforces, shared by the bubblewrap and seatbelt backends.

    Attributes:
        network: Network policy.
        limits: Resource limits.
        protected_paths: Workspace paths commands cannot write or create.
    """

    network: NetworkPolicy = attrs.field(factory=NetworkPolicy)
    limits: SandboxLimits = attrs.field(factory=SandboxLimits)
    protected_paths: tuple[ProtectedPath, ...] = DEFAULT_PROTECTED_PATHS

    @staticmethod
    def coerce_protected(value: Iterable[object] | None) -> tuple[ProtectedPath, ...]:
        """Accept ProtectedPath objects or strings (a trailing ``/`` marks a directory).

        Raises:
            ValueError: A malformed entry.
        """
        if value is None:
            return DEFAULT_PROTECTED_PATHS
        if isinstance(value, str):
            raise TypeError("protected_paths must be a list of paths")
        out: list[ProtectedPath] = []
        for item in value:
            if isinstance(item, ProtectedPath):
                out.append(item)
            elif isinstance(item, str):
                out.append(ProtectedPath(item.rstrip("/"), item.endswith("/")))
            else:
                raise TypeError("protected_paths entries must be strings")
        return tuple(out)
