"""Live detection of a usable bubblewrap backend; failing closed with a how-to-fix.

Detection runs the *real* flag set once (``true`` in a throwaway
workspace): a bwrap that exists but cannot create its namespaces here
(Ubuntu's AppArmor userns restriction, ``user.max_user_namespaces=0``, a
container without ``CAP_SYS_ADMIN``) is found at open, not at the first
command, and never leads to running unsandboxed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Final

import attrs

from corral.provider import WorkspaceFailedError
from corral_posix import WrapContext

from ._bwrap import BwrapFeatures, BwrapWrapper
from ._policy import SandboxPolicy
from ._seccomp import build_filter, native_arch

__all__ = ["BwrapBackend", "detect_bwrap"]

PROVIDER_ID: Final = "local-sandbox"
_PROBE_TIMEOUT_S: Final = 20.0
_SYSTEM_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_INSTALL_HINT: Final = (
    "install bubblewrap (Debian/Ubuntu: apt install bubblewrap; Fedora: dnf install "
    "bubblewrap; Arch: pacman -S bubblewrap) or pass the provider option bwrap_path"
)
_USERNS_HINT: Final = (
    "bubblewrap could not create its sandbox here. Check that unprivileged user "
    "namespaces are allowed (sysctl user.max_user_namespaces > 0; Debian: "
    "kernel.unprivileged_userns_clone=1; Ubuntu 23.10+: an AppArmor profile for bwrap or "
    "kernel.apparmor_restrict_unprivileged_userns=0) and, inside a container, that it "
    "permits namespace creation"
)


def _fail(message: str, cause: BaseException | None = None) -> WorkspaceFailedError:
    return WorkspaceFailedError(
        f"{PROVIDER_ID}: {message}; refusing to run commands unsandboxed",
        provider_id=PROVIDER_ID,
        cause=cause,
    )


@attrs.frozen
class BwrapBackend:
    """A bubblewrap installation that was shown to work on this machine.

    Attributes:
        bwrap: Absolute path of bwrap.
        version: ``bwrap --version`` output, e.g. ``"0.8.0"``.
        features: Optional flags it supports.
        prlimit: Absolute path of ``prlimit``.
        seccomp_program: The BPF program, or None when the platform cannot
            load one (``seccomp_problem`` says why).
        seccomp_problem: Why seccomp is off, or None.
    """

    bwrap: str
    version: str
    features: BwrapFeatures
    prlimit: str
    seccomp_program: bytes | None
    seccomp_problem: str | None = None


def _resolve_bwrap(bwrap_path: str | None) -> str:
    if bwrap_path is not None:
        path = os.path.abspath(bwrap_path)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise _fail(f"bubblewrap was not found at {path}; {_INSTALL_HINT}")
        return path
    found = shutil.which("bwrap", path=os.environ.get("PATH", ""))
    if found is None:
        raise _fail(f"bubblewrap (bwrap) is not on PATH; {_INSTALL_HINT}")
    return os.path.abspath(found)


def _run(argv: list[str], stdin_file: str | None = None) -> subprocess.CompletedProcess[str]:
    # A scrubbed environment: the probe must not depend on (or leak) the caller's.
    env = {"PATH": _SYSTEM_PATH, "LC_ALL": "C"}
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=env,
        timeout=_PROBE_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def _probe(wrapper: BwrapWrapper) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="corral-sandbox-probe-") as root:
        ctx = WrapContext(root=root, cwd=root, env={"PATH": _SYSTEM_PATH})
        launch = wrapper.wrap(["true"], ctx)
        return subprocess.run(
            list(launch.argv),
            capture_output=True,
            text=True,
            env=dict(launch.env),
            cwd=root,
            timeout=_PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )


def _brief(text: str) -> str:
    return " ".join(text.split())[:300] or "no output"


def detect_bwrap(
    bwrap_path: str | None,
    policy: SandboxPolicy,
    scratch_dir: str,
    *,
    cgroup_procs: Sequence[str] = (),
    nproc_in_cgroup: bool = False,
) -> BwrapBackend:
    """Find bwrap and prove it can build the full sandbox here (blocking).

    Args:
        bwrap_path: Explicit bwrap path, or None to search ``PATH``.
        policy: The policy the probe sandbox uses.
        scratch_dir: A private directory for the probe's seccomp program.
        cgroup_procs: The ``cgroup.procs`` files the probe joins (the workspace's cgroup).
        nproc_in_cgroup: The cgroup carries ``pids.max``, so no ``prlimit`` is needed.

    Raises:
        WorkspaceFailedError: What is missing and how to fix it.
    """
    bwrap = _resolve_bwrap(bwrap_path)
    try:
        version_out = _run([bwrap, "--version"])
        help_out = _run([bwrap, "--help"])
    except (OSError, subprocess.SubprocessError) as exc:
        raise _fail(f"bubblewrap at {bwrap} cannot be executed ({exc})", exc) from None
    match = re.search(r"(\d+\.\d+(?:\.\d+)?)", version_out.stdout)
    if version_out.returncode != 0 or match is None:
        raise _fail(f"{bwrap} does not look like bubblewrap ({_brief(version_out.stderr)})")
    features = BwrapFeatures.from_help(help_out.stdout + help_out.stderr)
    prlimit = shutil.which("prlimit", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if prlimit is None:
        raise _fail("prlimit (util-linux) is needed to apply resource limits; install util-linux")
    arch = native_arch()
    program = build_filter(arch) if arch is not None else None
    problem = None if arch is not None else "no seccomp filter for this CPU architecture"
    # A private name: another process may be probing for the same workspace.
    fd, seccomp_file = tempfile.mkstemp(prefix="probe-", suffix=".bpf", dir=scratch_dir)
    with os.fdopen(fd, "wb") as fh:
        fh.write(program or b"")
    base = BwrapWrapper(
        bwrap=bwrap,
        policy=policy,
        features=features,
        cgroup_procs=tuple(cgroup_procs),
        prlimit=None if nproc_in_cgroup else prlimit,
    )
    try:
        result = _probe(attrs.evolve(base, seccomp_file=seccomp_file) if program else base)
        if result.returncode != 0 and program is not None:
            bare = _probe(base)
            if bare.returncode == 0:
                problem = f"the kernel refused the seccomp filter ({_brief(result.stderr)})"
                program, result = None, bare
    except (OSError, subprocess.SubprocessError) as exc:
        raise _fail(f"the bubblewrap probe could not run ({exc})", exc) from None
    finally:
        os.unlink(seccomp_file)
    if result.returncode != 0:
        raise _fail(f"{_USERNS_HINT}. bwrap said: {_brief(result.stderr)}")
    return BwrapBackend(bwrap, match.group(1), features, prlimit, program, problem)
