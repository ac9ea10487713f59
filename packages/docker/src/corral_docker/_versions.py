"""Versions of a docker workspace on a local engine: posix-core's store, in place.

The workspace is a host directory bind-mounted into a container that keeps
running, so a restore cannot swap the root (the mount would keep pointing
at the old inode): posix-core's :class:`~corral_posix.TmpdirSnapshotter`
restores by difference through host directory fds instead. Two things are
docker's own:

* **Ownership.** The host writes as root; what a restore or branch creates
  is handed to the container user before it becomes visible under its
  name, and the root regains its shared-group mode afterwards, so the
  agent's commands can still change everything they could change before.
* **Commands in flight.** A command still writing while the tree is put
  back would leave a tree equal to no version. A restore first holds back
  new commands of this workspace (:class:`CommandGate`) and kills every
  process an exec started (each carries a ``CORRAL_EXEC`` marker in its
  environment, see :mod:`._shell`), in this process or any other; the
  container itself (its init and keep-alive process) keeps running.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Final

import anyio
import anyio.to_thread

from corral.provider import OperationError, ProgressCallback, WorkspaceRef
from corral_posix import TmpdirLayout, TmpdirSnapshotter

from ._engine import ContainerNotFoundError, DockerEngine, EngineError
from ._ownership import prepare_root

__all__ = ["KILL_EXECS", "CommandGate", "DockerSnapshotter"]

KILL_EXECS: Final = (
    "for pass in 1 2 3; do for p in /proc/[0-9]*; do "
    '[ "${p#/proc/}" = "$$" ] && continue; '
    "if tr '\\000' '\\n' < $p/environ 2>/dev/null | grep -q '^CORRAL_EXEC='; then "
    'kill -9 "${p#/proc/}" 2>/dev/null; fi; done; done; true'
)
"""Kills every process whose environment carries an exec marker (any exec's),
repeated so a process forking during the sweep is caught on the next pass."""


class CommandGate:
    """Holds new commands back while a restore rewrites the tree.

    The shell awaits :meth:`wait` before each exec; the restore runs inside
    :meth:`closed`. Only this workspace object's commands are held; commands
    another process starts are caught by the restore's kill sweep instead.
    """

    def __init__(self) -> None:
        self._done: anyio.Event | None = None

    async def wait(self) -> None:
        """Return once no restore is running."""
        while self._done is not None:
            await self._done.wait()

    def close(self) -> anyio.Event:
        """Start holding commands back; set the returned event to release them."""
        done = anyio.Event()
        self._done = done
        return done

    def open(self, done: anyio.Event) -> None:
        """Release the commands :meth:`close` held back."""
        if self._done is done:
            self._done = None
        done.set()


class DockerSnapshotter(TmpdirSnapshotter):
    """posix-core's versions over a bind-mounted workspace (see the module docstring).

    Args:
        layout: The provider's host layout.
        workspace: The workspace's directory name.
        make_ref: Builds the ref of a workspace name (for restore and branch).
        engine: The engine running the container.
        container: Returns the id of the live container.
        gate: Shared with the workspace's shell.
        user: ``UID:GID`` the container's commands run as.
        kill_grace_s: How long the kill sweep may take before the restore
            goes ahead anyway.
    """

    def __init__(
        self,
        layout: TmpdirLayout,
        workspace: str,
        make_ref: Callable[[str], WorkspaceRef],
        *,
        engine: DockerEngine,
        container: Callable[[], Awaitable[str]],
        gate: CommandGate,
        user: str,
        uid_gid: tuple[int, int],
        kill_grace_s: float = 10.0,
    ) -> None:
        uid, gid = uid_gid
        super().__init__(
            layout,
            workspace,
            make_ref,
            after_extract=lambda root, _state: prepare_root(root, uid, gid),
            # Only root may give files away; otherwise the host user's own
            # files stay reachable through prepare_root's shared modes.
            owner=(uid, gid) if os.geteuid() == 0 else None,
        )
        self._engine = engine
        self._container = container
        self._gate = gate
        self._user = user
        self._kill_grace_s = kill_grace_s

    async def _kill_commands(self) -> None:
        with anyio.move_on_after(self._kill_grace_s):
            try:
                container_id = await self._container()
                await self._engine.exec(
                    container_id,
                    ["sh", "-c", KILL_EXECS],
                    env={},
                    workdir="/",
                    user=self._user,
                    max_output_bytes=4096,
                )
            except ContainerNotFoundError:
                return  # no container, no command in flight
            except EngineError as exc:
                raise OperationError(
                    "docker: could not stop the running commands before the restore: "
                    f"{exc.message}",
                    code="failed",
                ) from None

    async def restore(
        self, snapshot_id: str, *, on_progress: ProgressCallback | None = None
    ) -> WorkspaceRef:
        """Stop the commands in flight, then restore by difference in place.

        Commands of this workspace wait until the restore is over; commands
        already running (started by any process) are killed first, so
        nothing writes into the tree while it is put back.

        Args:
            snapshot_id: The version to bring back.
            on_progress: As :meth:`TmpdirSnapshotter.restore`.

        Raises:
            OperationError: Unknown id, damaged stored content, or the
                running commands could not be stopped.
            WorkspaceEvictedError: The workspace directory is gone.
        """
        self._check_open()
        # An unknown id must not cost the running commands their lives.
        await anyio.to_thread.run_sync(self._meta, snapshot_id)
        done = self._gate.close()
        try:
            await self._kill_commands()
            return await super().restore(snapshot_id, on_progress=on_progress)
        finally:
            self._gate.open(done)
