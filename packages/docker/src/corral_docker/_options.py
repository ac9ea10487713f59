"""Docker provider options and the one hardened container-spec builder.

Every hardening default is an option; a weaker value is accepted only when
set explicitly, and :func:`weakened` names it so ``details()`` reports it.
``open`` and ``resolve`` both build containers through
:func:`build_container_spec`, so they cannot drift apart.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Final, Self

import attrs

from corral.provider import ConfigError

from ._engine import ContainerSpec, MountSpec, Ulimit

__all__ = [
    "CODE_IMAGE_ENV",
    "DEFAULT_CODE_IMAGE",
    "DEFAULT_IMAGE",
    "WORKDIR",
    "DockerOptions",
    "build_container_spec",
    "code_image",
    "hardening_details",
    "parse_size",
    "weakened",
]

DEFAULT_IMAGE: Final = "debian:bookworm-slim"
DEFAULT_CODE_IMAGE: Final = "corral-python:bookworm"
"""The image with interpreters (python3 + numpy + matplotlib, node) that
``scripts/ci-setup.sh`` builds from Debian's packages; busybox has none."""
CODE_IMAGE_ENV: Final = "CORRAL_DOCKER_CODE_IMAGE"
WORKDIR: Final = "/workspace"
NOBODY: Final = "65534:65534"
CONTAINER_TMP: Final = "/tmp"  # noqa: S108 -- a tmpfs inside the container, not the host's

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS: Final = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_USER = re.compile(r"^\d{1,10}(:\d{1,10})?$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,254}$")


def code_image() -> str:
    """The image to run code in: ``$CORRAL_DOCKER_CODE_IMAGE``, else :data:`DEFAULT_CODE_IMAGE`.

    Code runs inside the workspace's container, so a workspace that runs code
    is opened with ``image=code_image()`` (or any image that has the
    interpreters).
    """
    return os.environ.get(CODE_IMAGE_ENV) or DEFAULT_CODE_IMAGE


def parse_size(value: int | str, *, key: str) -> int:
    """Bytes from ``512m``-style strings or an int.

    Raises:
        ConfigError: Not a positive size; the message names ``key``.
    """
    if isinstance(value, bool):
        raise ConfigError(f"docker option {key} must be a size like '512m'")
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(f"docker option {key} must be positive")
        return value
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            size = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
            if size > 0:
                return size
    raise ConfigError(f"docker option {key} must be a size like '512m'")


def default_user() -> str:
    """The host user when not root; otherwise the unprivileged ``65534:65534``."""
    uid, gid = os.getuid(), os.getgid()
    return NOBODY if uid == 0 else f"{uid}:{gid}"


def _positive_int(key: str) -> Any:
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"docker option {key} must be a positive integer")

    return check


def _name_like(key: str, *, optional: bool = False) -> Any:
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        if value is None and optional:
            return
        if not isinstance(value, str) or not _NAME.match(value):
            raise ConfigError(f"docker option {key} is not a valid name")

    return check


def _user(_inst: Any, _attr: Any, value: Any) -> None:
    if not isinstance(value, str) or not _USER.match(value):
        raise ConfigError("docker option user must be numeric UID or UID:GID")


def _cpus(_inst: Any, _attr: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1024:
        raise ConfigError("docker option cpus must be a number in (0, 1024]")


def _flag(key: str) -> Any:
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        if not isinstance(value, bool):
            raise ConfigError(f"docker option {key} must be true or false")

    return check


def _to_tuple(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ConfigError("docker option cap_add must be a list")
    return tuple(value)


def _caps(_inst: Any, _attr: Any, value: Any) -> None:
    if not all(isinstance(c, str) and re.match(r"^[A-Z_]{2,40}$", c) for c in value):
        raise ConfigError("docker option cap_add must list capability names like NET_BIND_SERVICE")


@attrs.frozen
class DockerOptions:
    """Per-workspace container options; defaults are the hardened profile.

    Attributes:
        image: Image to run; must contain ``sh`` and basic POSIX tools.
        pull: Pull a missing image (fail closed when that fails).
        network: ``none`` (default), or an explicit Docker network name (weakening).
        memory: Memory limit in bytes (swap is pinned to the same value).
        cpus: CPU quota.
        pids_limit: Maximum number of processes.
        user: ``UID[:GID]`` inside the container; never root unless given explicitly.
        read_only_rootfs: Read-only root filesystem.
        tmpfs_size: Size of the ``/tmp`` tmpfs in bytes.
        nofile: ``RLIMIT_NOFILE``.
        fsize: ``RLIMIT_FSIZE`` in bytes.
        no_new_privileges: ``--security-opt no-new-privileges``.
        init: Run docker's init (tini) as pid 1, reaping orphans.
        cap_add: Capabilities given back after dropping all (weakening).
        runtime: OCI runtime, e.g. ``runsc`` for gVisor.
    """

    image: str = attrs.field(default=DEFAULT_IMAGE, validator=_name_like("image"))
    pull: bool = attrs.field(default=True, validator=_flag("pull"))
    network: str = attrs.field(default="none", validator=_name_like("network"))
    memory: int = attrs.field(default=512 * 1024**2, validator=_positive_int("memory"))
    cpus: float = attrs.field(default=1.0, validator=_cpus)
    pids_limit: int = attrs.field(default=256, validator=_positive_int("pids_limit"))
    user: str = attrs.field(factory=default_user, validator=_user)
    read_only_rootfs: bool = attrs.field(default=True, validator=_flag("read_only_rootfs"))
    tmpfs_size: int = attrs.field(default=64 * 1024**2, validator=_positive_int("tmpfs_size"))
    nofile: int = attrs.field(default=1024, validator=_positive_int("nofile"))
    fsize: int = attrs.field(default=1024**3, validator=_positive_int("fsize"))
    no_new_privileges: bool = attrs.field(default=True, validator=_flag("no_new_privileges"))
    init: bool = attrs.field(default=True, validator=_flag("init"))
    cap_add: tuple[str, ...] = attrs.field(default=(), converter=_to_tuple, validator=_caps)
    runtime: str | None = attrs.field(default=None, validator=_name_like("runtime", optional=True))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], base: DockerOptions | None = None) -> Self:
        """Options from user input layered over ``base``; sizes accept ``'512m'``.

        Raises:
            ConfigError: Unknown key or bad value; messages name the key only.
        """
        known = {a.name for a in attrs.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown docker option(s): {', '.join(unknown)[:200]}")
        merged = attrs.asdict(base) if base is not None else {}
        for key, value in values.items():
            if key == "cap_add" and isinstance(value, str):
                raise ConfigError("docker option cap_add must be a list")
            sized = key in ("memory", "tmpfs_size", "fsize") and value is not None
            merged[key] = parse_size(value, key=key) if sized else value
        if merged.get("user") is None:
            merged.pop("user", None)
        return cls(**merged)

    @property
    def uid_gid(self) -> tuple[int, int]:
        """Numeric user and group."""
        uid, _, gid = self.user.partition(":")
        return int(uid), int(gid or uid)


def weakened(opts: DockerOptions) -> list[str]:
    """Names of the hardening defaults these options weaken."""
    out: list[str] = []
    if opts.network != "none":
        out.append("network")
    if not opts.read_only_rootfs:
        out.append("read_only_rootfs")
    if not opts.no_new_privileges:
        out.append("no_new_privileges")
    if not opts.init:
        out.append("init")
    if opts.cap_add:
        out.append("cap_add")
    if opts.uid_gid[0] == 0:
        out.append("user")
    return out


def hardening_details(opts: DockerOptions) -> dict[str, Any]:
    """The effective hardening, as ``details()`` reports it."""
    return {
        "image": opts.image,
        "network": opts.network,
        "read_only_rootfs": opts.read_only_rootfs,
        "tmpfs": {CONTAINER_TMP: opts.tmpfs_size},
        "cap_drop": ["ALL"],
        "cap_add": list(opts.cap_add),
        "no_new_privileges": opts.no_new_privileges,
        "init": opts.init,
        "pids_limit": opts.pids_limit,
        "memory_bytes": opts.memory,
        "memory_swap_bytes": opts.memory,
        "cpus": opts.cpus,
        "ulimits": {"nofile": opts.nofile, "fsize": opts.fsize},
        "user": opts.user,
        "runtime": opts.runtime or "default",
        "seccomp": "docker default",
        "privileged": False,
        "host_namespaces": False,
        "cgroupns": "private",
        "ipc": "private",
        "weakened": weakened(opts),
    }


def build_container_spec(
    opts: DockerOptions, *, name: str, labels: Mapping[str, str], mount: MountSpec
) -> ContainerSpec:
    """The hardened container for one workspace; the only place specs are made."""
    security = ("no-new-privileges",) if opts.no_new_privileges else ()
    return ContainerSpec(
        image=opts.image,
        name=name,
        # The container idles; commands arrive by exec. `sleep` exits on
        # SIGTERM under tini, so stop is fast.
        command=("sleep", "2147483647"),
        user=opts.user,
        working_dir=WORKDIR,
        labels=dict(labels),
        mounts=(mount,),
        network_mode=opts.network,
        read_only_rootfs=opts.read_only_rootfs,
        tmpfs={CONTAINER_TMP: f"rw,nosuid,nodev,noexec,size={opts.tmpfs_size},mode=1777"},
        cap_drop=("ALL",),
        cap_add=opts.cap_add,
        security_opt=security,
        init=opts.init,
        pids_limit=opts.pids_limit,
        memory_bytes=opts.memory,
        memory_swap_bytes=opts.memory,
        nano_cpus=int(opts.cpus * 1e9),
        ulimits=(
            Ulimit("nofile", opts.nofile, opts.nofile),
            Ulimit("fsize", opts.fsize, opts.fsize),
            Ulimit("core", 0, 0),
        ),
        runtime=opts.runtime,
        environment={"HOME": CONTAINER_TMP, "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"},
    )
