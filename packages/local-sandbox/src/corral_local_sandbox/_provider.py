"""``local-sandbox``: local-bash's filesystem and shell with every command in an OS sandbox.

The isolation enters through posix-core's CommandWrapper seam, so the
shell's app-layer guards (allowlist, metacharacters, environment, cwd,
byte caps) run first and the sandbox is defense in depth behind them.
Backend detection is live at every ``open`` and ``resolve`` and fails
closed: no usable sandbox, no workspace.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, ClassVar, Final

import anyio
import anyio.to_thread
import attrs

from corral.provider import FileSystem, OperationError, Shell, WorkspaceFailedError
from corral_posix import (
    CommandWrapper,
    Isolation,
    ProcessChecks,
    ProcessLimits,
    TmpdirWorkspaceProvider,
    WrapContext,
    WrappedCommand,
    remove_tree,
)

from ._bwrap import BwrapWrapper
from ._cgroup import (
    CgroupUnavailable,
    WorkspaceCgroup,
    WorkspaceProcesses,
    release_recorded,
    workspace_cgroup,
)
from ._detect import PROVIDER_ID, BwrapBackend, detect_bwrap
from ._gitconfig import git_config_is_safe
from ._policy import (
    SANDBOX_ROOT,
    NetworkPolicy,
    ProtectedPath,
    SandboxLimits,
    SandboxPolicy,
)
from ._protect import ProtectedPathChecker
from ._protected_fs import ProtectedFileSystem
from ._protected_shell import ProtectedShell
from ._quota import DiskQuota, QuotaFileSystem, QuotaShell
from ._script import build_script_runner
from ._seatbelt import SANDBOX_EXEC, SeatbeltWrapper
from ._seccomp import denied_syscalls

__all__ = ["LocalSandboxProvider"]

log = logging.getLogger("corral.local_sandbox")


@attrs.define
class _Resources:
    """Per-workspace sandbox resources: built before the shell, released when it closes.

    They live in the workspace's state directory and in a cgroup named after
    it, so the next ``resolve`` of the workspace (a CLI call in a new process
    that exits without closing) reuses them instead of leaking new ones.
    """

    wrapper: CommandWrapper
    scratch: str
    facts: dict[str, Any]
    cgroup: WorkspaceCgroup | None = None

    def release(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        release_recorded(self.scratch)
        with contextlib.suppress(OSError, OperationError):
            remove_tree(self.scratch)


_NO_COMMANDS: Final = frozenset({"fs", "snapshot"})
"""Modules that never run a command: a workspace of only these needs no sandbox."""
_PROCESS_CHECK_INTERVAL_S: Final = 2.0


@attrs.frozen
class _TerminalBwrap:
    """The bubblewrap launch of a process that has a pseudo-terminal.

    bwrap's ``--new-session`` (kept: CVE-2017-5226) calls ``setsid()``,
    which detaches any controlling terminal: ``/dev/tty`` would fail, no
    SIGWINCH on resize, no SIGINT on ^C, no job control. Keeping the
    host-side session instead does not work either: its process groups lie
    outside the sandbox's pid namespace (``tcgetpgrp`` reads 0, shells
    cannot restore the terminal), and bwrap's monitor, in the foreground
    group, would die of the ^C meant for the program. So the process host
    only starts a session (no controlling terminal), and *inside* the
    sandbox ``setsid --ctty`` starts the command in a session of the
    namespace whose controlling terminal is the pty on its stdin. Every
    process group is then visible to the programs that manage them, and
    bwrap stays outside the terminal's session. The pty is private (only the
    process host and the manager hold its master), and the seccomp filter
    refuses ``TIOCSTI``/``TIOCLINUX`` besides.
    """

    inner: BwrapWrapper
    setsid: str

    def wrap(self, argv: Sequence[str], ctx: WrapContext) -> WrappedCommand:
        """The inner launch with the command started by ``setsid --ctty --wait``."""
        return self.inner.wrap([self.setsid, "--ctty", "--wait", *argv], ctx)


def _terminal_wrapper(wrapper: CommandWrapper) -> CommandWrapper | None:
    """The terminal launch for a bwrap sandbox (None: the process host's own ctty)."""
    if not isinstance(wrapper, BwrapWrapper):
        return None
    found = shutil.which("setsid", path="/usr/bin:/bin")
    return _TerminalBwrap(wrapper, found) if found else _NoTerminal(wrapper)


@attrs.frozen
class _NoTerminal:
    """Refuses terminals when the sandbox has no ``setsid`` to give one its session."""

    inner: BwrapWrapper

    def wrap(self, argv: Sequence[str], ctx: WrapContext) -> WrappedCommand:
        """Raise: a terminal without a controlling tty would half-work."""
        raise OperationError(
            "terminals in the sandbox need util-linux's setsid in /usr/bin or /bin",
            code="unsupported",
        )


_HOME_FALLBACK: Final = "/var/empty"
_SCRATCH: Final = "sandbox"
_OVER_QUOTA: Final = "over-quota"


def _write_atomically(path: str, data: bytes) -> None:
    # Another process's launcher may be reading the previous copy right now.
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o400)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class LocalSandboxProvider(TmpdirWorkspaceProvider):
    """Workspaces in a host tmpdir whose commands run in bubblewrap (Linux) or seatbelt (macOS).

    Args:
        network: ``"off"`` (default) or ``"on"``, or a :class:`NetworkPolicy`.
        limits: :class:`SandboxLimits` or a mapping of overrides.
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
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"fs", "shell", "code", "process", "script", "snapshot"}
    )

    def __init__(
        self,
        *,
        network: NetworkPolicy | str | Mapping[str, Any] = "off",
        limits: SandboxLimits | Mapping[str, Any] | None = None,
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
            limits=SandboxLimits.coerce(limits),
            protected_paths=SandboxPolicy.coerce_protected(protected_paths),
        )
        # Every rlimit but RLIMIT_NPROC is set by the shell's supervisor on the
        # launcher and inherited through bwrap: no extra exec per command. On
        # Linux the memory limit is the workspace's cgroup; RLIMIT_AS on top
        # would only break runtimes that reserve far more address space than
        # they use (Go, the JVM, Node, sanitizers) without bounding anything more.
        lim = policy.limits
        shell_limits = ProcessLimits(
            cpu_s=lim.cpu_seconds,
            address_space_bytes=lim.memory_bytes if sys.platform == "darwin" else None,
            file_size_bytes=lim.effective_file_size(),
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

    def _prepare(self, state_dir: str) -> _Resources:
        """Detect the backend and build or reuse one workspace's sandbox resources (blocking)."""
        system: str = sys.platform
        if not system.startswith("linux") and system != "darwin":
            raise WorkspaceFailedError(
                f"{PROVIDER_ID}: no sandbox backend for {system}; refusing to run "
                "commands unsandboxed (use the docker provider)",
                provider_id=PROVIDER_ID,
            )
        # Not /tmp: a CLI call that exits without closing would leak one per call.
        scratch = os.path.join(state_dir, _SCRATCH)
        with contextlib.suppress(FileExistsError):
            os.mkdir(scratch, 0o700)
        if system == "darwin":
            return self._prepare_seatbelt(scratch)
        return self._prepare_bwrap(scratch, state_dir)

    def _prepare_bwrap(self, scratch: str, state_dir: str) -> _Resources:
        cgroup = self._make_cgroup(state_dir, scratch)
        try:
            return self._prepare_bwrap_in(scratch, cgroup)
        except BaseException:
            if cgroup is not None:  # no usable sandbox: no workspace, no cgroup
                cgroup.remove()
            raise

    def _prepare_bwrap_in(self, scratch: str, cgroup: WorkspaceCgroup | None) -> _Resources:
        pids_in_cgroup = (
            cgroup is not None
            and "pids" in cgroup.controllers
            and self._policy.limits.processes is not None
        )
        backend = detect_bwrap(
            self._bwrap_path,
            self._policy,
            scratch,
            cgroup_procs=cgroup.procs_files if cgroup else (),
            nproc_in_cgroup=pids_in_cgroup,
        )
        if backend.seccomp_program is None and os.geteuid() == 0:
            # The sandbox user is host root: without the filter that refuses
            # set-id modes, a command could leave a root setuid file on the host.
            raise WorkspaceFailedError(
                f"{PROVIDER_ID}: running as root and the seccomp filter is unavailable "
                f"({backend.seccomp_problem}); refusing to run commands that could create "
                "root-owned set-id files on the host; run as a regular user",
                provider_id=PROVIDER_ID,
            )
        seccomp_file = None
        if backend.seccomp_program is not None:
            seccomp_file = os.path.join(scratch, "filter.bpf")
            _write_atomically(seccomp_file, backend.seccomp_program)
        wrapper = BwrapWrapper(
            bwrap=backend.bwrap,
            policy=self._policy,
            features=backend.features,
            seccomp_file=seccomp_file,
            cgroup_procs=cgroup.procs_files if cgroup else (),
            # With a pids cgroup RLIMIT_NPROC is unneeded (and ignored for root).
            prlimit=None if pids_in_cgroup else backend.prlimit,
        )
        facts = self._bwrap_facts(backend, cgroup, pids_in_cgroup)
        return _Resources(wrapper, scratch, facts, cgroup)

    def _make_cgroup(self, state_dir: str, scratch: str) -> WorkspaceCgroup | None:
        lim = self._policy.limits
        root = os.geteuid() == 0
        try:
            return workspace_cgroup(
                state_dir=state_dir,
                scratch=scratch,
                pids=lim.processes,
                memory=lim.memory_bytes,
                require_pids=root,
            )
        except CgroupUnavailable as exc:
            why = str(exc)
        if root:
            advice = "mount the cgroup memory and pids controllers"
        else:
            advice = (
                "run the agent with a delegated cgroup v2 subtree whose "
                "cgroup.subtree_control enables memory (and pids)"
            )
        raise WorkspaceFailedError(
            f"{PROVIDER_ID}: the workspace's memory and process limits need a cgroup and "
            f"{why}; {advice}, or set limits={{'memory_bytes': None}} (and, as root, "
            "'processes': None) to run without them",
            provider_id=PROVIDER_ID,
        )

    def _bwrap_facts(
        self, backend: BwrapBackend, cgroup: WorkspaceCgroup | None, pids_in_cgroup: bool
    ) -> dict[str, Any]:
        memory = cgroup is not None and self._policy.limits.memory_bytes is not None
        return {
            "backend": "bubblewrap",
            "bwrap": backend.bwrap,
            "bwrap_version": backend.version,
            "seccomp": backend.seccomp_program is not None,
            "seccomp_problem": backend.seccomp_problem,
            "seccomp_denied": dict(denied_syscalls()) if backend.seccomp_program else {},
            "nested_userns_disabled": backend.features.disable_userns,
            "tmpfs_size_limited": backend.features.tmpfs_size,
            "process_limit": "pids cgroup" if pids_in_cgroup else "RLIMIT_NPROC",
            "memory_limit": "memory cgroup" if memory else None,
            "memory_swap_limited": bool(memory and cgroup and cgroup.swap_limited),
            "cgroups": list(cgroup.paths) if cgroup else [],
            **self._policy_facts(),
        }

    def _policy_facts(self) -> dict[str, Any]:
        return {
            "network": self._policy.network.mode,
            "limits": attrs.asdict(self._policy.limits),
            "protected_paths": [p.path for p in self._policy.protected_paths],
        }

    def _quota(self, root: str, scratch: str) -> DiskQuota | None:
        limit = self._policy.limits.disk_bytes
        if limit is None:
            return None
        return DiskQuota(root, os.path.join(scratch, _OVER_QUOTA), limit)

    def _prepare_seatbelt(self, scratch: str) -> _Resources:
        if not os.access(SANDBOX_EXEC, os.X_OK):
            raise WorkspaceFailedError(
                f"{PROVIDER_ID}: {SANDBOX_EXEC} is missing; refusing to run commands unsandboxed",
                provider_id=PROVIDER_ID,
            )
        home = os.environ.get("HOME") or _HOME_FALLBACK
        tmp = os.path.join(scratch, "tmp")
        with contextlib.suppress(FileExistsError):
            os.mkdir(tmp, 0o700)
        wrapper = SeatbeltWrapper(self._policy, os.path.realpath(tmp), home)
        facts = {"backend": "seatbelt", "seccomp": False, **self._policy_facts()}
        return _Resources(wrapper, scratch, facts)

    def _checker(self, root: str, state_dir: str, *, deep: bool = True) -> ProtectedPathChecker:
        """Build a workspace's protected-path checker and run its check (blocking).

        Runs at every open and resolve, and after every restore and branch:
        whatever a dead process's command, a snapshot or the host left at a
        protected path is judged before anything trusts it.

        Args:
            root: The workspace directory.
            state_dir: Its state directory.
            deep: Also walk the whole tree for nested repositories (False
                after a restore that changed no path named like one).
        """
        checker = ProtectedPathChecker(
            root,
            state_dir,
            self._policy.protected_paths,
            validators={".git/config": git_config_is_safe},
        )
        result = checker.check(deep=deep)
        if not result.clean:
            log.warning("a protected path of %s could not be made safe", root)
        return checker

    def _tree_writers(self, state_dir: str) -> WorkspaceProcesses | None:
        """What lets snapshots keep a change journal here, or None.

        Under bubblewrap no command can make a hard link from outside the
        workspace to a file in it (every other writable mount is a private
        tmpfs: ``EXDEV``), and with a memory limit every command runs in the
        workspace's cgroup, whose members the journal checks for writable
        shared mappings. Elsewhere (macOS, or no memory limit) snapshots
        walk the whole tree.
        """
        if not sys.platform.startswith("linux") or self._policy.limits.memory_bytes is None:
            return None
        # Where no cgroup hierarchy is found, it answers None: whole walks.
        return WorkspaceProcesses(state_dir)

    async def prepare_isolation(
        self, root: str, *, state_dir: str, capabilities: frozenset[str]
    ) -> Isolation:
        """Check the protected paths and, for a shell or code, build the sandbox (fails closed).

        Whatever stands at a protected path and is not acceptable (a file a
        dead process's command planted, say) is quarantined here, before
        anything trusts it.

        Raises:
            WorkspaceFailedError: No usable sandbox backend; the message says
                what is missing and how to fix it.
        """
        checker = await anyio.to_thread.run_sync(self._checker, root, state_dir)
        protected = self._policy.protected_paths

        def protect_fs(fs: FileSystem) -> FileSystem:
            resolver = getattr(fs, "resolver", "auto")
            return ProtectedFileSystem(fs, protected, root=root, checker=checker, resolver=resolver)

        def verify(new_root: str, new_state: str) -> None:
            self._checker(new_root, new_state)

        tops = {p.path.split("/", 1)[0] for p in protected}

        def verify_patch(new_root: str, new_state: str, names: AbstractSet[str]) -> None:
            # Everything else was checked after the command that last changed it
            # (a branch has nothing else); the deep walk looks for nested
            # repositories, which need an entry named like one.
            # (One C-level search: a branch of 100,000 files names them all.)
            deep = not tops.isdisjoint(names) or "\0.git" in "\0" + "\0".join(names)
            self._checker(new_root, new_state, deep=deep)

        writers = self._tree_writers(state_dir)

        # Fail closed: every module but the file tools may run a command.
        if capabilities <= _NO_COMMANDS:
            return Isolation(
                details={"backend": None},
                decorate_fs=protect_fs,
                after_extract=verify,
                tree_writers=writers,
                after_patch=verify_patch,
            )
        resources = await anyio.to_thread.run_sync(self._prepare, state_dir)
        # Where the sandbox's commands see the workspace (corral's one path namespace).
        resources.facts["workspace_path"] = SANDBOX_ROOT
        quota = self._quota(root, resources.scratch)
        if quota is not None:
            resources.facts["disk_quota_bytes"] = quota.limit

        script = None
        if "script" in capabilities:
            try:
                script = await anyio.to_thread.run_sync(
                    lambda: build_script_runner(
                        wrapper=resources.wrapper,
                        policy=self._policy,
                        workspace_cgroup=resources.cgroup,
                        scratch=resources.scratch,
                        state_dir=state_dir,
                        base_dir=self.layout.base_dir,
                        limits=self._shell_limits,
                        base_env=self._base_env,
                    )
                )
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(resources.release)
                raise
            resources.facts.update(script.details())

        async def cleanup() -> None:
            if script is not None:
                script.close()
            await anyio.to_thread.run_sync(resources.release)

        def protect_shell(shell: Shell) -> Shell:
            guarded: Shell = ProtectedShell(shell, checker)
            return guarded if quota is None else QuotaShell(guarded, quota)

        def quota_fs(fs: FileSystem) -> FileSystem:
            guarded = protect_fs(fs)
            return guarded if quota is None else QuotaFileSystem(guarded, quota)

        wrapper = resources.wrapper
        return Isolation(
            wrapper=wrapper,
            cleanup=cleanup,
            details=resources.facts,
            decorate_shell=protect_shell,
            decorate_fs=quota_fs,
            after_extract=verify,
            tree_writers=writers,
            after_patch=verify_patch,
            terminal_wrapper=_terminal_wrapper(wrapper),
            process_checks=_process_checks(checker, quota),
            script=script,
        )


def _process_checks(checker: ProtectedPathChecker, quota: DiskQuota | None) -> ProcessChecks:
    """The shell's before/after guards, for processes that outlive any one call.

    A command is checked before it starts and after it ends; a background
    process has no "after" until it ends, so while any runs the protected
    paths are checked (planted files quarantined) and the workspace measured
    every couple of seconds, and once more after the last one ends. Over the
    quota, or with a protected path that cannot be made safe, every running
    process of the workspace is killed: the bound is the quota plus what a
    process writes in one interval (each file also capped by RLIMIT_FSIZE).
    """

    async def before_start() -> None:
        before = await checker.acheck()
        if not before.clean:
            raise OperationError(
                "a file planted at a protected path could not be removed; "
                "remove it from the host to start processes",
                code="policy_denied",
            )
        if quota is not None:
            await quota.refuse_if_over()

    def monitor() -> str | None:
        if not checker.check(deep=True).clean:
            return "a file planted at a protected path could not be removed"
        if quota is None:
            return None
        try:
            usage = quota.update()
        except OSError:
            return "the workspace could not be measured against its disk quota"
        return "the workspace exceeded its disk quota" if usage.bytes > quota.limit else None

    return ProcessChecks(
        before_start=before_start, monitor=monitor, interval_s=_PROCESS_CHECK_INTERVAL_S
    )
