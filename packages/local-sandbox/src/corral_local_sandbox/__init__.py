"""corral-local-sandbox: the local filesystem plus kernel-enforced isolation.

``LocalSandboxProvider`` (kind ``local-sandbox``) gives local-bash's
filesystem and guarded shell, and runs every command in a fresh
bubblewrap sandbox on Linux (namespaces, no capabilities, seccomp,
rlimits, read-only system, network off by default) or under a generated
seatbelt profile on macOS. It fails closed when no sandbox can be built.
"""

from __future__ import annotations

from ._bwrap import BwrapFeatures, BwrapWrapper, build_bwrap_args
from ._detect import BwrapBackend, detect_bwrap
from ._policy import (
    DEFAULT_PROTECTED_PATHS,
    SANDBOX_HOME,
    SANDBOX_ROOT,
    NetworkPolicy,
    ProtectedPath,
    SandboxLimits,
    SandboxPolicy,
)
from ._protected_fs import ProtectedFileSystem
from ._provider import LocalSandboxProvider
from ._seatbelt import SeatbeltWrapper, seatbelt_params, seatbelt_profile
from ._seccomp import build_filter, denied_syscalls, native_arch

__all__ = [
    "DEFAULT_PROTECTED_PATHS",
    "SANDBOX_HOME",
    "SANDBOX_ROOT",
    "BwrapBackend",
    "BwrapFeatures",
    "BwrapWrapper",
    "LocalSandboxProvider",
    "NetworkPolicy",
    "ProtectedFileSystem",
    "ProtectedPath",
    "SandboxLimits",
    "SandboxPolicy",
    "SeatbeltWrapper",
    "build_bwrap_args",
    "build_filter",
    "denied_syscalls",
    "detect_bwrap",
    "native_arch",
    "seatbelt_params",
    "seatbelt_profile",
]
