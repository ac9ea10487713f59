"""The bubblewrap command line and the CommandWrapper that applies it.

Launch shape (one fresh sandbox per command)::

    /bin/sh -c LAUNCHER corral-sandbox SECCOMP_FILE N PROCS_1 .. PROCS_N \\
        bwrap <flags> -- [prlimit --nproc=N:N --] [/bin/sh -c 'exec "$@"' sh] <guarded argv>

The tiny POSIX-sh launcher exists so that nothing needs to outlive the
spawn in the parent: it opens the seccomp program as fd 9 for bwrap
(``--seccomp 9``) and, when the workspace has a cgroup, writes its own pid
into the ``cgroup.procs`` of every hierarchy (pids, memory) so bwrap and
everything below it are bounded from the first instruction, then
``exec``\\ s bwrap; with neither, bwrap is executed directly. The other
rlimits are set by the shell's process supervisor on the launcher and
inherited through bwrap; only ``RLIMIT_NPROC`` must be set *inside* the user
namespace (``prlimit``), and only when no pids cgroup enforces it.

bwrap reports a failed ``execvp`` as exit status 1; every other provider
gives 127 (not found) and 126 (not executable). When the program is not a
bare name found executable in the read-only system directories (which the
sandbox sees exactly as the host does), it is started through
``sh -c 'exec "$@"'``, whose ``exec`` gives those statuses. The common case
(``sh -c CMD``, ``python3``...) pays nothing.

No secret is on any command line; bwrap is
launched with the command's own guarded environment (no ``--setenv``), so
``/proc/1/environ`` inside shows nothing the command cannot already see.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from typing import Final

import attrs

from corral.provider import OperationError
from corral_posix import WrapContext, WrappedCommand

from ._policy import SANDBOX_HOME, SANDBOX_ROOT, SandboxPolicy

__all__ = [
    "ETC_SECRETS",
    "EXEC_SHIM",
    "LAUNCHER",
    "SECCOMP_FD",
    "SYSTEM_PATHS",
    "BwrapFeatures",
    "BwrapWrapper",
    "build_bwrap_args",
    "sandbox_env",
]

SECCOMP_FD: Final = 9
SANDBOX_UID: Final = 1000
DEFAULT_PATH: Final = "/usr/local/bin:/usr/bin:/bin"

SYSTEM_PATHS: Final = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
"""Host directories visible read-only (merged-/usr symlinks are recreated as symlinks)."""

ETC_SECRETS: Final = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/security/opasswd",
    "/etc/NetworkManager/system-connections",
    "/etc/wireguard",
    "/etc/docker",
    "/etc/containers/auth.json",
)
"""Host files hidden inside the read-only ``/etc``: the sandbox user maps to the
caller's uid, so anything the caller can read would otherwise be readable."""

# $1 = seccomp program file ("" = none), $2 = how many cgroup.procs files follow.
LAUNCHER: Final = (
    'unset PWD OLDPWD; f=$1 n=$2; shift 2; while [ "$n" -gt 0 ]; do '
    'echo $$ >"$1" || exit 125; shift; n=$((n - 1)); done; '
    f'if [ -n "$f" ]; then exec "$@" {SECCOMP_FD}<"$f"; fi; exec "$@"'
)

EXEC_SHIM: Final = ("/bin/sh", "-c", 'exec "$@"', "sh")
"""Runs a program so that a failed exec exits 127 (not found) or 126 (not executable)."""


@attrs.frozen
class BwrapFeatures:
    """Optional flags the installed bubblewrap understands.

    Attributes:
        disable_userns: ``--disable-userns`` (0.8.0): nested user namespaces
            are refused by the kernel, not only by seccomp.
        tmpfs_size: ``--size`` (0.8.0): private tmpfs mounts are capped.
    """

    disable_userns: bool = False
    tmpfs_size: bool = False

    @classmethod
    def from_help(cls, help_text: str) -> BwrapFeatures:
        """Read the features off ``bwrap --help``."""
        return cls(
            disable_userns="--disable-userns" in help_text,
            tmpfs_size="--size" in help_text,
        )


def _system_binds(paths: Sequence[str]) -> list[str]:
    args: list[str] = []
    for path in paths:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _secret_masks(paths: Sequence[str]) -> list[str]:
    args: list[str] = []
    for path in paths:
        if os.path.islink(path):
            continue  # its target lies outside /etc's bind or is itself masked
        if os.path.isdir(path):
            args += ["--tmpfs", path, "--remount-ro", path]
        elif os.path.exists(path):
            args += ["--ro-bind", "/dev/null", path]
    return args


def _tmpfs(path: str, size: int | None, features: BwrapFeatures) -> list[str]:
    if size is not None and features.tmpfs_size:
        return ["--size", str(size), "--tmpfs", path]
    return ["--tmpfs", path]


def build_bwrap_args(
    *,
    host_root: str,
    host_cwd: str,
    policy: SandboxPolicy,
    features: BwrapFeatures,
    seccomp: bool,
    system_paths: Sequence[str] = SYSTEM_PATHS,
    secret_paths: Sequence[str] = ETC_SECRETS,
    sandbox_root: str = SANDBOX_ROOT,
    bind_workspace: bool = True,
) -> list[str]:
    """The bubblewrap flags (everything between ``bwrap`` and ``--``).

    Args:
        host_root: Host path of the workspace, bound read-write at ``sandbox_root``.
        host_cwd: Host working directory, inside ``host_root``.
        policy: Network and limits.
        features: What the installed bwrap supports.
        seccomp: Whether to pass ``--seccomp`` (the launcher opens the fd).
        system_paths: Host directories visible read-only.
        secret_paths: Host paths masked inside those directories.
        sandbox_root: Stable in-sandbox path of the workspace. Nothing else
            inside the workspace is bound: a bind by host path is resolved by
            bwrap long after any check, so the protected paths are verified
            around each command instead (see ``_protect.py``).
        bind_workspace: False puts an empty private tmpfs at ``sandbox_root``
            instead of the workspace (a ``script`` box sees none of it).

    Raises:
        OperationError: ``invalid_path`` when ``host_cwd`` lies outside the
            workspace.
    """
    host_root = os.path.realpath(host_root)
    rel = os.path.relpath(os.path.realpath(host_cwd), host_root)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        raise OperationError("the working directory is outside the workspace", code="invalid_path")
    cwd = sandbox_root if rel == os.curdir else f"{sandbox_root}/{rel}"
    args = [
        "--new-session",
        "--die-with-parent",
        "--unshare-all",
        "--unshare-user",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
    ]
    if policy.network.mode == "on":
        args.append("--share-net")
    if features.disable_userns:
        args.append("--disable-userns")
    args += ["--cap-drop", "ALL", "--hostname", "sandbox"]
    args += _system_binds(system_paths)
    args += _secret_masks(secret_paths)
    if policy.network.mode == "on":
        # resolv.conf is often a symlink into /run (systemd-resolved).
        args += ["--ro-bind-try", "/run/systemd/resolve", "/run/systemd/resolve"]
    size = policy.limits.tmpfs_bytes
    # --dev is a writable tmpfs: keep only /dev/shm writable, and bounded.
    args += ["--proc", "/proc", "--dev", "/dev", *_tmpfs("/dev/shm", size, features)]  # noqa: S108 - in-sandbox path
    args += ["--remount-ro", "/dev"]
    args += _tmpfs("/tmp", size, features)  # noqa: S108 - in-sandbox path
    args += _tmpfs(SANDBOX_HOME, size, features)
    if bind_workspace:
        args += ["--bind", host_root, sandbox_root]
    else:
        args += _tmpfs(sandbox_root, size, features)
    # bwrap's own root is a tmpfs; left writable it would be an unbounded RAM sink.
    args += ["--remount-ro", "/", "--chdir", cwd]
    if seccomp:
        args += ["--seccomp", str(SECCOMP_FD)]
    return args


def sandbox_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a sandboxed command (and of bwrap, which passes it on)."""
    out = {k: v for k, v in env.items() if k not in ("PWD", "OLDPWD")}
    out.update(HOME=SANDBOX_HOME, TMPDIR="/tmp")  # noqa: S108 - in-sandbox path
    # Host-only PATH entries (venvs, ~/.local/bin) do not exist inside; drop them.
    inside = [p for p in out.get("PATH", "").split(":") if _visible(p)]
    out["PATH"] = ":".join(inside) or DEFAULT_PATH
    return out


def _visible(path: str) -> bool:
    return any(path == s or path.startswith(s + "/") for s in SYSTEM_PATHS if s != "/etc")


@attrs.frozen(kw_only=True)
class BwrapWrapper:
    """A CommandWrapper running each command in a fresh bubblewrap sandbox.

    Attributes:
        bwrap: Absolute path of the bwrap binary.
        policy: The sandbox policy.
        features: What the installed bwrap supports.
        seccomp_file: Host file holding the BPF program, or None when the
            platform cannot load one.
        cgroup_procs: The ``cgroup.procs`` files of the workspace's cgroup
            (one per hierarchy); empty when it has none.
        prlimit: Absolute path of ``prlimit`` (visible inside through ``/usr``)
            to set ``RLIMIT_NPROC`` inside the sandbox, or None when a pids
            cgroup limits processes or there is no process limit.
        shell: The POSIX shell running the launcher.
        bind_workspace: Whether the sandbox sees the workspace (False: an
            empty tmpfs in its place, for ``script`` boxes).
    """

    bwrap: str
    policy: SandboxPolicy
    features: BwrapFeatures
    seccomp_file: str | None = None
    cgroup_procs: tuple[str, ...] = ()
    prlimit: str | None = None
    shell: str = "/bin/sh"
    bind_workspace: bool = True

    def wrap(self, argv: Sequence[str], ctx: WrapContext) -> WrappedCommand:
        """Return the launcher command that runs ``argv`` sandboxed.

        Raises:
            OperationError: The cwd is outside the workspace.
        """
        flags = build_bwrap_args(
            host_root=ctx.root,
            host_cwd=ctx.cwd,
            policy=self.policy,
            features=self.features,
            seccomp=self.seccomp_file is not None,
            bind_workspace=self.bind_workspace,
        )
        env = sandbox_env(ctx.env)
        inner = list(argv)
        if not _found_on_path(inner[0], env["PATH"]):
            inner = [*EXEC_SHIM, *inner]
        processes = self.policy.limits.processes
        if self.prlimit is not None and processes is not None:
            inner = [self.prlimit, f"--nproc={processes}:{processes}", "--", *inner]
        launch = [self.bwrap, *flags, "--", *inner]
        if self.seccomp_file is not None or self.cgroup_procs:
            launch = [
                self.shell,
                "-c",
                LAUNCHER,
                "corral-sandbox",
                self.seccomp_file or "",
                str(len(self.cgroup_procs)),
                *self.cgroup_procs,
                *launch,
            ]
        return WrappedCommand(argv=tuple(launch), env=env, signal_as_status=True)


def _found_on_path(program: str, path: str) -> bool:
    """Whether bwrap's ``execvp`` is sure to find ``program`` executable.

    Only bare names count: the sandbox's ``PATH`` holds nothing but the
    read-only system directories, identical inside and out, so the host's
    view is the sandbox's. A path (``./x``, ``/workspace/x``) names workspace
    content the host must not judge.
    """
    if not program or "/" in program:
        return False
    for directory in path.split(":"):
        if not _visible(directory):
            continue
        candidate = os.path.join(directory, program)
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and os.access(candidate, os.X_OK):
            return True
    return False
