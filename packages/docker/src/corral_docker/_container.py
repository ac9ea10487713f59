"""One workspace's container: created hardened, replaced on resolve, removed at close."""

from __future__ import annotations

import secrets
from collections.abc import Mapping

import anyio

from corral.provider import WorkspaceEvictedError, WorkspaceFailedError

from ._engine import (
    ContainerNotFoundError,
    DockerEngine,
    EngineClientMissingError,
    EngineError,
    EngineUnavailableError,
    ImageNotFoundError,
    MountSpec,
)
from ._labels import LABEL_MANAGED, LABEL_WORKSPACE
from ._options import DockerOptions, build_container_spec

__all__ = ["WorkspaceContainer", "engine_failure"]

PROVIDER_ID = "docker"


def engine_failure(exc: EngineError, *, where: str) -> WorkspaceFailedError:
    """The WorkspaceFailedError for an engine error at open/resolve time."""
    if isinstance(exc, EngineClientMissingError):
        msg = f"docker: {exc.message} ({where})"
    elif isinstance(exc, EngineUnavailableError):
        msg = (
            f"docker: cannot reach the Docker daemon ({where}); start dockerd, check "
            "DOCKER_HOST / the base_url option, and that this user may use the socket"
        )
    elif isinstance(exc, ImageNotFoundError):
        msg = (
            f"docker: the configured image is not present and could not be pulled "
            f"({exc.message}; at {where}); pull or build it on the engine "
            "(docker pull / docker build) or set the image option"
        )
    else:
        msg = f"docker: {exc.message} ({where})"
    return WorkspaceFailedError(msg, provider_id=PROVIDER_ID, transient=exc.transient, cause=exc)


class WorkspaceContainer:
    """The container of one workspace, created lazily and at most once at a time.

    Args:
        engine: The engine to use.
        opts: Hardening and limits.
        workspace: The workspace name (label and container-name suffix).
        labels: Labels of the container (ownership, session, root).
        mount: How the workspace reaches ``/workspace``.
    """

    def __init__(
        self,
        engine: DockerEngine,
        opts: DockerOptions,
        *,
        workspace: str,
        labels: Mapping[str, str],
        mount: MountSpec,
    ) -> None:
        self._engine = engine
        self._opts = opts
        self._workspace = workspace
        self._labels = {**labels, LABEL_MANAGED: "1", LABEL_WORKSPACE: workspace}
        self._mount = mount
        self._id: str | None = None
        self._lock = anyio.Lock()
        self._closed = False

    @property
    def container_id(self) -> str | None:
        """The live container's id, if one was started."""
        return self._id

    async def replace(self) -> str:
        """Remove every container of this workspace, then create and start a fresh one.

        Used by open and resolve, so after a crash exactly one container
        serves the workspace.

        Raises:
            EngineError: The engine refused.
        """
        async with self._lock:
            for old in await self._engine.list_containers({LABEL_WORKSPACE: self._workspace}):
                await self._engine.remove(old.id)
            self._id = await self._create()
            return self._id

    def adopt(self, container_id: str) -> None:
        """Take over an already started container (from the pool)."""
        self._id = container_id

    async def _create(self) -> str:
        name = f"corral-{self._workspace}-{secrets.token_hex(3)}"[:120]
        spec = build_container_spec(self._opts, name=name, labels=self._labels, mount=self._mount)
        cid = await self._engine.create(spec)
        try:
            await self._engine.start(cid)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._engine.remove(cid)
            raise
        return cid

    async def get(self) -> str:
        """The live container id for module calls.

        Raises:
            WorkspaceEvictedError: No container is running (the re-resolve
                recreates it).
        """
        if self._id is None or self._closed:
            raise WorkspaceEvictedError(
                "docker: the workspace container is gone", provider_id=PROVIDER_ID
            )
        return self._id

    async def check_running(self) -> None:
        """Raise WorkspaceEvictedError when the container stopped or vanished."""
        cid = await self.get()
        try:
            info = await self._engine.inspect(cid)
        except ContainerNotFoundError:
            info = None
        if info is None or not info.running:
            raise WorkspaceEvictedError(
                "docker: the workspace container stopped", provider_id=PROVIDER_ID
            )

    async def remove(self) -> None:
        """Stop and remove the container; idempotent."""
        self._closed = True
        async with self._lock:
            cid, self._id = self._id, None
            if cid is not None:
                await self._engine.remove(cid)
