"""``local-sandbox``: local-bash's filesystem and shell with every command in an OS sandbox.

The isolation enters through posix-core's CommandWrapper seam, so the
shell's app-layer guards (allowlist, metacharacters, environment, cwd,
byte caps) run first and the sandbox is defense in depth behind them.
Backend detection is live at every ``open`` and ``resolve`` and fails
closed: no usable sandbox, no workspace.
"""

from __future__ import annotations

import contextvars
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Final

import anyio
import anyio.to_thread
import attrs

from corral import (
    CommandRequest,
    ExecResult,
    ModularWorkspace,
    OpenedWorkspace,
    ProviderConfig,
    SessionRef,
    Shell,
    WorkspaceFailedError,
    WorkspaceRef,
    describe_workspace,
)
from corral_posix._provider import TmpdirWorkspaceProvider
from corral_posix._wrapper import CommandWrapper

from ._bwrap import BwrapWrapper
from ._cgroup import PidsCgroup, find_pids_hierarchy
from ._detect import PROVIDER_ID, BwrapBackend, detect_bwrap
from ._policy import (
    NetworkPolicy,
    ProtectedPath,
    ResourceLimits,
    SandboxPolicy,
)
from ._protected_fs import ProtectedFileSystem
from ._seatbelt import SANDBOX_EXEC, SeatbeltWrapper
from ._seccomp import denied_syscalls

__all__ = ["LocalSandboxProvider"]


@attrs.define
class _Isolation:
    """Per-workspace sandbox resources: built before the shell, released with it."""

    wrapper: CommandWrapper
    scratch: str
    facts: dict[str, Any]
    cgroup: PidsCgroup | None = None

    def release(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        shutil.rmtree(self.scratch, ignore_errors=True)


# open()/resolve() prepare the isolation off the event loop, then the base class
# calls the synchronous command_wrapper()/build_shell() hooks; the context
# variable carries the prepared isolation across, per task, so concurrent
# opens on one provider never see each other's.
_PENDING: contextvars.ContextVar[_Isolation | None] = contextvars.ContextVar(
    "corral_local_sandbox_pending", default=None
)


class _SandboxedShell:
    """The posix-core shell plus the sandbox resources it must release on close."""

    def __init__(self, inner: Shell, isolation: _Isolation) -> None:
        self._inner = inner
        self._isolation = isolation

    async def run(self, request: CommandRequest) -> ExecResult:
        """Run one guarded command inside the sandbox."""
        return await self._inner.run(request)

    async def aclose(self) -> None:
        """Close the inner shell, then kill leftovers and delete the sandbox's scratch files."""
        try:
            aclose = getattr(self._inner, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            await anyio.to_thread.run_sync(self._isolation.release)


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
            (``tmpdir_root``, ``max_file_bytes``, ``shell_limits``, ``base_env``...).

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
        super().__init__(**base_options)
        self._policy = SandboxPolicy(
            network=NetworkPolicy.coerce(network),
            limits=ResourceLimits.coerce(limits),
            protected_paths=SandboxPolicy.coerce_protected(protected_paths),
        )
        self._bwrap_path = os.fspath(bwrap_path) if bwrap_path is not None else None

    @property
    def policy(self) -> SandboxPolicy:
        """The sandbox policy every workspace of this provider gets."""
        return self._policy

    # -- isolation ---------------------------------------------------------------

    def _prepare(self) -> _Isolation:
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
            return self._prepare_bwrap(scratch)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise

    def _prepare_bwrap(self, scratch: str) -> _Isolation:
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
            backend.bwrap,
            backend.prlimit,
            self._policy,
            backend.features,
            seccomp_file=seccomp_file,
            cgroup_procs=cgroup.procs_file if cgroup else None,
        )
        return _Isolation(wrapper, scratch, self._bwrap_facts(backend, cgroup), cgroup)

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

    def _prepare_seatbelt(self, scratch: str) -> _Isolation:
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
        return _Isolation(wrapper, scratch, facts)

    # -- base-class hooks --------------------------------------------------------

    def command_wrapper(self) -> CommandWrapper | None:
        """The sandbox wrapper prepared by the ``open``/``resolve`` in progress.

        Raises:
            WorkspaceFailedError: Called outside ``open``/``resolve`` (fail closed).
        """
        isolation = _PENDING.get()
        if isolation is None:
            raise WorkspaceFailedError(
                f"{PROVIDER_ID}: a shell was requested without a prepared sandbox",
                provider_id=PROVIDER_ID,
            )
        return isolation.wrapper

    def build_shell(self, root: str) -> Shell:
        """posix-core's shell, wrapped so closing it releases the sandbox resources."""
        isolation = _PENDING.get()
        inner = super().build_shell(root)
        assert isolation is not None  # command_wrapper() above refused otherwise
        return _SandboxedShell(inner, isolation)

    # -- the provider contract ---------------------------------------------------

    async def _with_isolation(self, action: Any, declared: frozenset[str] | None) -> Any:
        wants_shell = declared is None or "shell" in declared
        isolation = await anyio.to_thread.run_sync(self._prepare) if wants_shell else None
        token = _PENDING.set(isolation)
        try:
            result = await action()
        except BaseException:
            if isolation is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(isolation.release)
            raise
        finally:
            _PENDING.reset(token)
        return _decorate(result, isolation, self._policy)

    async def open(
        self,
        config: ProviderConfig,
        session: SessionRef,
        declared: frozenset[str] | None = None,
    ) -> OpenedWorkspace:
        """Create a workspace whose commands run sandboxed.

        Raises:
            WorkspaceFailedError: No usable sandbox backend (the message says
                what is missing and how to fix it), or any failure of the base
                provider.
        """
        opened: OpenedWorkspace = await self._with_isolation(
            lambda: super(LocalSandboxProvider, self).open(config, session, declared), declared
        )
        return opened

    async def resolve(self, ref: WorkspaceRef) -> ModularWorkspace:
        """Re-attach a workspace, re-detecting the sandbox backend first.

        Raises:
            WorkspaceFailedError: As :meth:`open`, or a foreign/malformed/lost ref.
        """
        caps = ref.capabilities or self.capabilities
        ws: ModularWorkspace = await self._with_isolation(
            lambda: super(LocalSandboxProvider, self).resolve(ref), frozenset(caps)
        )
        return ws


def _decorate(result: Any, isolation: _Isolation | None, policy: SandboxPolicy) -> Any:
    """Guard the file tools and add the sandbox facts to ``details()``."""
    ws = result.workspace if isinstance(result, OpenedWorkspace) else result
    facts = isolation.facts if isolation is not None else {"backend": None}

    def details() -> Mapping[str, Any]:
        return {**describe_workspace(ws), **facts}

    decorated = ModularWorkspace(
        ws.id,
        fs=ProtectedFileSystem(ws.fs, policy.protected_paths) if ws.fs is not None else None,
        shell=ws.shell,
        snapshot=ws.snapshot,
        on_close=ws.close,
        details=details,
    )
    if isinstance(result, OpenedWorkspace):
        return OpenedWorkspace(workspace=decorated, ref=result.ref)
    return decorated
