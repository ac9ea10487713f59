"""``local-sandbox``: local-bash's filesystem and shell with every command in an OS sandbox.

The isolation enters through posix-core's CommandWrapper seam, so the
shell's app-layer guards (allowlist, metacharacters, environment, cwd,
byte caps) run first and the sandbox is defense in depth behind them.
Backend detection is live at every ``open`` and ``resolve`` and fails
closed: no usable sandbox, no workspace.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Final

import anyio
import anyio.to_thread
import attrs

from corral import FileSystem, Shell, WorkspaceFailedError
from corral_posix import Isolation, TmpdirWorkspaceProvider
from corral_posix._shell import ResourceLimits as ShellLimits
from corral_posix._wrapper import CommandWrapper

from ._bwrap import BwrapWrapper
from ._cgroup import PidsCgroup, find_pids_hierarchy
from ._detect import PROVIDER_ID, BwrapBackend, detect_bwrap
from ._gitconfig import git_config_is_safe
from ._guarded_shell import GuardedShell
from ._policy import (
    NetworkPolicy,
    ProtectedPath,
    ResourceLimits,
    SandboxPolicy,
)
from ._protect import PathGuard
from ._protected_fs import ProtectedFileSystem
from ._seatbelt import SANDBOX_EXEC, SeatbeltWrapper
from ._seccomp import denied_syscalls

__all__ = ["LocalSandboxProvider"]

log = logging.getLogger("corral.local_sandbox")


@attrs.define
class _Resources:
    """Per-workspace sandbox resources: built before the shell, released after it."""

    wrapper: CommandWrapper
    scratch: str
    facts: dict[str, Any]
    cgroup: PidsCgroup | None = None

    def release(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        shutil.rmtree(self.scratch, ignore_errors=True)


_HOME_FALLBACK: Final = "/var/empty"


class LocalSandboxProvider(TmpdirWorkspaceProvider):
    """Workspaces in a host tmpdir whose commands run in bubblewrap (Linux) or seatbelt (macOS).

    Args:
        network: ``"off"`` (default) or ``"on"``, or a :class:`NetworkPolicy`.
        limits: :class:`ResourceLimits` or a mapping of overrides.
        protected_paths: Workspace paths commands cannot write or create;
            default :data:`DEFAULT_PROTECTED_PATHS`. Strings ending in ``/``
            are directories.
        bwrap_path: bwrap binary; default ``bwrap`` on ``PATH``.
        **base_options: Options of :class:`corral_posix.TmpdirWorkspaceProvider`
            (``tmpdir_root``, ``max_file_bytes``, ``base_env``...). Resource
            limits come from ``limits``; ``shell_limits`` is refused.

    Raises:
        ValueError: A malformed option.
    """

    provider_id: ClassVar[str] = PROVIDER_ID
    capabilities: ClassVar[frozenset[str]] = frozenset({"fs", "shell", "snapshot"})

    def __init__(
        self,
        *,
        network: NetworkPolicy | str | Mapping[str, Any] = "off",
        limits: ResourceLimits | Mapping[str, Any] | None = None,
        protected_paths: Iterable[ProtectedPath | str] | None = None,
        bwrap_path: str | os.PathLike[str] | None = None,
        **base_options: Any,
    ) -> None:
        if "shell_limits" in base_options:
            raise ValueError(
                "local-sandbox takes resource limits from 'limits', not 'shell_limits'"
            )
        policy = SandboxPolicy(
            network=NetworkPolicy.coerce(network),
            limits=ResourceLimits.coerce(limits),
            protected_paths=SandboxPolicy.coerce_protected(protected_paths),
        )
        # Every rlimit but RLIMIT_NPROC is set by the shell's supervisor on the
        # launcher and inherited through bwrap: no extra exec per command.
        lim = policy.limits
        shell_limits = ShellLimits(
            cpu_s=lim.cpu_seconds,
            address_space_bytes=lim.memory_bytes,
            file_size_bytes=lim.file_size_bytes,
            open_files=lim.open_files,
            core=0,
        )
        super().__init__(shell_limits=shell_limits, **base_options)
        self._policy = policy
        self._bwrap_path = os.fspath(bwrap_path) if bwrap_path is not None else None

    @property
    def policy(self) -> SandboxPolicy:
        """The sandbox policy every workspace of this provider gets."""
        return self._policy

    # -- isolation ---------------------------------------------------------------

    def _prepare(self, guard: PathGuard) -> _Resources:
        """Detect the backend and build one workspace's sandbox resources (blocking)."""
        system: str = sys.platform
        if not system.startswith("linux") and system != "darwin":
            raise WorkspaceFailedError(
                f"{PROVIDER_ID}: no sandbox backend for {system}; refusing to run "
                "commands unsandboxed (use the docker provider)",
                provider_id=PROVIDER_ID,
            )
        scratch = tempfile.mkdtemp(prefix="corral-sandbox-")
        try:
            if system == "darwin":
                return self._prepare_seatbelt(scratch)
            return self._prepare_bwrap(scratch, guard)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise

    def _prepare_bwrap(self, scratch: str, guard: PathGuard) -> _Resources:
        cgroup = self._make_cgroup()
        try:
            backend = detect_bwrap(
                self._bwrap_path,
                self._policy,
                scratch,
                cgroup_procs=cgroup.procs_file if cgroup else None,
            )
            seccomp_file = None
            if backend.seccomp_program is not None:
                seccomp_file = os.path.join(scratch, "filter.bpf")
                with open(seccomp_file, "wb") as fh:
                    fh.write(backend.seccomp_program)
                os.chmod(seccomp_file, 0o400)
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            raise
        wrapper = BwrapWrapper(
            bwrap=backend.bwrap,
            policy=self._policy,
            features=backend.features,
            seccomp_file=seccomp_file,
            cgroup_procs=cgroup.procs_file if cgroup else None,
            # With a pids cgroup (root) RLIMIT_NPROC is both ignored and unneeded.
            prlimit=None if cgroup else backend.prlimit,
            guard=guard,
        )
        return _Resources(wrapper, scratch, self._bwrap_facts(backend, cgroup), cgroup)

    def _make_cgroup(self) -> PidsCgroup | None:
        processes = self._policy.limits.processes
        if processes is None or os.geteuid() != 0:
            return None
        hierarchy = find_pids_hierarchy()
        failure = "no writable pids cgroup hierarchy was found"
        if hierarchy is not None:
            try:
                return PidsCgroup(hierarchy, processes)
            except OSError as exc:
                failure = f"the pids cgroup could not be created ({exc.strerror})"
        raise WorkspaceFailedError(
            f"{PROVIDER_ID}: running as root, where the kernel ignores RLIMIT_NPROC, and "
            f"{failure}; run as a regular user, mount the cgroup pids controller, or set "
            "limits={'processes': None} to accept no process limit",
            provider_id=PROVIDER_ID,
        )

    def _bwrap_facts(self, backend: BwrapBackend, cgroup: PidsCgroup | None) -> dict[str, Any]:
        return {
            "backend": "bubblewrap",
            "bwrap": backend.bwrap,
            "bwrap_version": backend.version,
            "seccomp": backend.seccomp_program is not None,
            "seccomp_problem": backend.seccomp_problem,
            "seccomp_denied": dict(denied_syscalls()) if backend.seccomp_program else {},
            "nested_userns_disabled": backend.features.disable_userns,
            "tmpfs_size_limited": backend.features.tmpfs_size,
            "process_limit": "pids cgroup" if cgroup else "RLIMIT_NPROC",
            **self._policy_facts(),
        }

    def _policy_facts(self) -> dict[str, Any]:
        return {
            "network": self._policy.network.mode,
            "limits": attrs.asdict(self._policy.limits),
            "protected_paths": [p.path for p in self._policy.protected_paths],
        }

    def _prepare_seatbelt(self, scratch: str) -> _Resources:
        if not os.access(SANDBOX_EXEC, os.X_OK):
            raise WorkspaceFailedError(
                f"{PROVIDER_ID}: {SANDBOX_EXEC} is missing; refusing to run commands unsandboxed",
                provider_id=PROVIDER_ID,
            )
        home = os.environ.get("HOME") or _HOME_FALLBACK
        tmp = os.path.join(scratch, "tmp")
        os.mkdir(tmp, 0o700)
        wrapper = SeatbeltWrapper(self._policy, os.path.realpath(tmp), home)
        facts = {"backend": "seatbelt", "seccomp": False, **self._policy_facts()}
        return _Resources(wrapper, scratch, facts)

    def _guard(self, root: str, state_dir: str) -> PathGuard:
        guard = PathGuard(
            root,
            state_dir,
            self._policy.protected_paths,
            validators={".git/config": git_config_is_safe},
        )
        for note in guard.start():
            log.warning("%s", note.strip())
        return guard

    async def prepare_isolation(
        self, root: str, *, state_dir: str, capabilities: frozenset[str]
    ) -> Isolation:
        """Check the protected paths and, for a shell, build the sandbox (fails closed).

        A process that died while a command ran may have left a planted file
        at a protected path: it is quarantined here, before anything trusts it.

        Raises:
            WorkspaceFailedError: No usable sandbox backend; the message says
                what is missing and how to fix it.
        """
        guard = await anyio.to_thread.run_sync(self._guard, root, state_dir)
        protected = self._policy.protected_paths

        def guard_fs(fs: FileSystem) -> FileSystem:
            return ProtectedFileSystem(fs, protected)

        if "shell" not in capabilities:
            return Isolation(details={"backend": None}, decorate_fs=guard_fs)
        resources = await anyio.to_thread.run_sync(self._prepare, guard)

        async def cleanup() -> None:
            await anyio.to_thread.run_sync(resources.release)

        def guard_shell(shell: Shell) -> Shell:
            return GuardedShell(shell, guard)

        return Isolation(
            wrapper=resources.wrapper,
            cleanup=cleanup,
            details=resources.facts,
            decorate_shell=guard_shell,
            decorate_fs=guard_fs,
        )
