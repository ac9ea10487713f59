"""The ``script`` module of local-sandbox: one script per fresh bubblewrap box.

Each call starts a new sandbox from the workspace's own builders (the
bubblewrap flags, the seccomp program, the rlimits of its shell) with three
differences: nothing of the workspace is mounted (an empty, size-capped
tmpfs is the working directory), the network is always unshared whatever the
workspace's policy, and the box gets a cgroup of its own with the
workspace's memory and process limits -- so a script's allocation bomb or
fork bomb meets the same bounds as a shell command, without starving the
workspace's shell and code contexts, and killing the cgroup ends the whole
box. The interpreter is ``python3 -I`` or ``node``, fed the driver of
:mod:`corral_posix._scriptdriver` on stdin; its result frame arrives on a
private socket passed in at a fixed fd. Nothing persists between calls: every box,
its tmpfs and its cgroup are gone when the call returns.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import socket
from collections.abc import Mapping, Sequence
from typing import Final

import anyio
import anyio.to_thread
import attrs

from corral.provider import CommandRequest, OperationError, WorkspaceFailedError
from corral_posix import ProcessLimits, SubprocessShell, WrapContext, WrappedCommand
from corral_posix._env import base_environment
from corral_posix._scriptbox import BoxRun, BoxScriptRunner, frame_cap
from corral_posix._scriptdriver import LANGUAGE_PROGRAMS, find_frame

from ._bwrap import BwrapWrapper, sandbox_env
from ._cgroup import (
    CGROUP_PREFIX,
    Placement,
    WorkspaceCgroup,
    _register,
    _unregister,
    base_tag,
    find_placements,
    owner_index,
)
from ._detect import PROVIDER_ID
from ._policy import NetworkPolicy, SandboxPolicy

__all__ = ["SandboxScriptRunner", "build_script_runner", "script_languages"]

_FIRST_CHANNEL_FD: Final = 10
_MIB: Final = 1 << 20


def script_languages(root: str, base_env: Mapping[str, str]) -> frozenset[str]:
    """The script languages whose interpreter the box really has (blocking).

    The box sees the host's system directories read-only, so an
    interpreter found on the box's ``PATH`` here is the one it runs.
    """
    env = sandbox_env({**base_environment(root), **base_env})
    path = env["PATH"]
    return frozenset(
        lang for lang, program in LANGUAGE_PROGRAMS.items() if shutil.which(program, path=path)
    )


@attrs.frozen
class _Channel:
    """The box's launch with the result channel's fd passed in (same number inside)."""

    inner: BwrapWrapper
    fd: int

    def wrap(self, argv: Sequence[str], ctx: WrapContext) -> WrappedCommand:
        """The inner launch, passing the channel's fd (same number inside)."""
        wrapped = self.inner.wrap(argv, ctx)
        return attrs.evolve(wrapped, pass_fds=(*wrapped.pass_fds, self.fd))


class SandboxScriptRunner(BoxScriptRunner):
    """Runs each script in a fresh bubblewrap box that sees nothing of the workspace.

    Results are :class:`~corral_posix._scriptbox.BoxScriptRunner`'s; the
    box's own cgroup tells a ``MemoryError`` (the kernel killed it for
    memory) from another kill.

    Args:
        wrapper: The workspace's bubblewrap launch (seccomp, rlimit shim).
        policy: The workspace's policy (its limits bound each box).
        placements: Where each box's cgroup goes (empty: no cgroup limits).
        empty_root: An empty host directory the launcher starts in (never
            visible inside the box).
        state_dir: The workspace's state directory (the box cgroups' owner).
        base_dir: The provider's base directory (names the cgroups).
        languages: From :func:`script_languages`.
        limits: rlimits of each box's launcher (the shell's).
        base_env: Operator-trusted variables for the interpreter.
        max_output_bytes: Cap of stdout, of stderr and of the result's JSON.
        max_timeout_s: Ceiling of a run's timeout.
    """

    def __init__(
        self,
        *,
        wrapper: BwrapWrapper,
        policy: SandboxPolicy,
        placements: Sequence[Placement],
        empty_root: str,
        state_dir: str,
        base_dir: str,
        languages: frozenset[str],
        limits: ProcessLimits | None,
        base_env: Mapping[str, str] | None = None,
        max_output_bytes: int = _MIB,
        max_timeout_s: float = 60.0,
    ) -> None:
        super().__init__(
            languages,
            box="bubblewrap, no workspace, no network, own cgroup",
            missing="none: no interpreter was found in the box",
            max_output_bytes=max_output_bytes,
            max_timeout_s=max_timeout_s,
            memory_bytes=policy.limits.memory_bytes,
        )
        # Network off whatever the workspace allows; the rest is the workspace's.
        box_policy = attrs.evolve(policy, network=NetworkPolicy.coerce("off"))
        self._wrapper = attrs.evolve(
            wrapper, policy=box_policy, bind_workspace=False, cgroup_procs=()
        )
        self._policy = policy
        self._placements = tuple(placements)
        self._root = empty_root
        self._state_dir = state_dir
        self._tag = base_tag(base_dir)
        self._limits = limits
        self._base_env = dict(base_env or {})

    async def _run_box(self, language: str, code: str, timeout_s: float) -> BoxRun:
        """One box: the driver on stdin, its frame on a socket passed in at a fixed fd."""
        cgroup = await anyio.to_thread.run_sync(self._new_cgroup)
        ours, theirs = socket.socketpair()
        channel = -1
        try:
            channel = _channel_fd(theirs)
            theirs.close()
            program = self._program(language, code, channel_fd=channel)
            wrapper = _Channel(
                attrs.evolve(self._wrapper, cgroup_procs=cgroup.procs_files if cgroup else ()),
                channel,
            )
            shell = SubprocessShell(
                self._root, wrapper=wrapper, base_env=self._base_env, limits=self._limits
            )
            request = CommandRequest(
                command=" ".join(program.argv),
                stdin=program.stdin,
                timeout_s=timeout_s,
                max_output_bytes=self._cap,
            )
            frame_bytes = bytearray()
            async with anyio.create_task_group() as tg:
                tg.start_soon(_drain, ours, frame_bytes, frame_cap(self._cap))
                try:
                    result = await shell.run(request)
                finally:
                    # The box is gone: our copy was the last writer, so the drain ends.
                    channel = _close_fd(channel)
                    await shell.aclose()
            oom = cgroup is not None and await anyio.to_thread.run_sync(_oom_killed, cgroup)
        finally:
            ours.close()
            theirs.close()
            _close_fd(channel)
            if cgroup is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self._drop_cgroup, cgroup)
        frame, _ = find_frame(bytes(frame_bytes), program.marker)
        return BoxRun(result, frame, oom=oom)

    # -- the box's cgroup (blocking) -------------------------------------------------

    def _new_cgroup(self) -> WorkspaceCgroup | None:
        if not self._placements:
            return None
        lim = self._policy.limits
        name = f"{CGROUP_PREFIX}{self._tag}-{secrets.token_hex(8)}"
        index = owner_index()
        if index is not None:
            # Owned by the workspace: a crash leaves it to the next open's sweep.
            _register(index, name, self._state_dir)
        try:
            return WorkspaceCgroup(
                self._placements, name, pids=lim.processes, memory=lim.memory_bytes
            )
        except OSError as exc:
            _unregister(index, name)
            raise OperationError(
                f"the script's cgroup could not be set up ({exc.strerror})", code="failed"
            ) from None

    def _drop_cgroup(self, cgroup: WorkspaceCgroup) -> None:
        cgroup.remove()
        name = os.path.basename(cgroup.paths[0]) if cgroup.paths else None
        if name is not None:
            _unregister(owner_index(), name)


def box_placements(workspace_cgroup: WorkspaceCgroup | None) -> list[Placement]:
    """Where script boxes' cgroups go: beside the workspace's, with its controllers (blocking)."""
    if workspace_cgroup is None:
        return []
    placements, _ = find_placements(workspace_cgroup.controllers)
    return placements


def _channel_fd(sock: socket.socket) -> int:
    """A copy of the box's end of the channel at fd 10 or above.

    The box gets it at the same number (the reaper's passes keep numbers);
    low numbers are taken: 0-2 are the streams, and the launcher opens the
    seccomp program as fd 9.
    """
    return fcntl.fcntl(sock.fileno(), fcntl.F_DUPFD_CLOEXEC, _FIRST_CHANNEL_FD)


def _close_fd(fd: int) -> int:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)
    return -1


async def _drain(sock: socket.socket, into: bytearray, cap: int) -> None:
    """Read the result channel until EOF, keeping at most ``cap`` bytes."""
    sock.setblocking(False)
    while True:
        await anyio.wait_readable(sock)
        try:
            data = sock.recv(256 * 1024)
        except BlockingIOError:
            continue
        except OSError:
            return
        if not data:
            return
        room = cap - len(into)
        if room > 0:
            into += data[:room]


def _oom_killed(cgroup: WorkspaceCgroup) -> bool:
    """Whether the kernel killed a process of the box for memory."""
    for path in cgroup.paths:
        for name in ("memory.events", "memory.oom_control"):
            with contextlib.suppress(OSError), open(os.path.join(path, name)) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                        return True
    return False


def build_script_runner(
    *,
    wrapper: object,
    policy: SandboxPolicy,
    workspace_cgroup: WorkspaceCgroup | None,
    scratch: str,
    state_dir: str,
    base_dir: str,
    limits: ProcessLimits | None,
    base_env: Mapping[str, str] | None,
) -> SandboxScriptRunner:
    """The ``script`` module of one workspace (blocking: probes the box and the cgroups).

    Raises:
        WorkspaceFailedError: The sandbox is not bubblewrap (seatbelt has no
            box without the workspace); fail closed rather than run bare.
    """
    if not isinstance(wrapper, BwrapWrapper):
        raise WorkspaceFailedError(
            f"{PROVIDER_ID}: script boxes need bubblewrap (Linux); this sandbox cannot run them",
            provider_id=PROVIDER_ID,
        )
    empty = os.path.join(scratch, "script-root")
    with contextlib.suppress(FileExistsError):
        os.mkdir(empty, 0o700)
    env = dict(base_env or {})
    return SandboxScriptRunner(
        wrapper=wrapper,
        policy=policy,
        placements=box_placements(workspace_cgroup),
        empty_root=empty,
        state_dir=state_dir,
        base_dir=base_dir,
        languages=script_languages(empty, env),
        limits=limits,
        base_env=env,
    )
