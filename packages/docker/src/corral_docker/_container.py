"""One workspace's container: created hardened, joined or replaced on resolve, removed at close.

Several handles may hold one workspace at once (a ref resolved while the
handle that opened it is still open, in this process or another). They
must share one container: replacing it would pull the container out from
under the other handle's shell, processes and -- on a remote engine, where
file operations go through the container -- its file system. So resolve
*joins* a running container of the workspace whose owner is alive or
cannot be checked from here, and replaces only containers that are
provably orphaned (stopped, or owned by a process that died on this host).
Whether an owner is alive is a host-local fact; :mod:`._labels` says when
this process can know it. A container mounts the workspace and runs the
options it was created with, so it is joined only when its labels name
the same mount and the same container spec (:func:`spec_digest`).

Within one process the handles of a container are counted: the container
goes when the last one closes, and only if this process owns it; a
container another process owns is left to that process (or to ``corral
docker gc`` after a crash).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
from collections.abc import Mapping

import anyio
import attrs

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
from ._labels import (
    LABEL_MANAGED,
    LABEL_ROOT,
    LABEL_SPEC,
    LABEL_WORKSPACE,
    owned_here,
    owner_alive,
)
from ._options import DockerOptions, build_container_spec

__all__ = ["WorkspaceContainer", "engine_failure", "spec_digest"]

PROVIDER_ID = "docker"

_holders: dict[str, int] = {}
"""Container id -> open WorkspaceContainer objects of this process using it."""
_holders_lock = threading.Lock()


def _hold(container_id: str) -> None:
    with _holders_lock:
        _holders[container_id] = _holders.get(container_id, 0) + 1


def _release(container_id: str) -> bool:
    """Drop one holder; True when it was the last one in this process."""
    with _holders_lock:
        left = _holders.get(container_id, 1) - 1
        if left > 0:
            _holders[container_id] = left
            return False
        _holders.pop(container_id, None)
        return True


def spec_digest(opts: DockerOptions, mount: MountSpec) -> str:
    """A digest of everything a container runs with, except its name and labels.

    Two handles may share a container only when this matches: a handle must
    never run its commands under limits or a network it was not given.
    """
    spec = build_container_spec(opts, name="", labels={}, mount=mount)
    fields = attrs.asdict(spec, filter=lambda a, _v: a.name not in ("name", "labels"))
    raw = json.dumps(fields, sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()[:32]


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
        self._labels = {
            **labels,
            LABEL_MANAGED: "1",
            LABEL_WORKSPACE: workspace,
            LABEL_SPEC: spec_digest(opts, mount),
        }
        self._mount = mount
        self._id: str | None = None
        self._owned = False
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
            return self._take(await self._create(), owned=True)

    async def join_or_start(self) -> str:
        """Join the container a live handle of this workspace uses, else start a fresh one.

        Used by resolve. Orphans (stopped containers, containers whose owner
        died on this host) are removed; a running container whose owner is
        alive or unknown here, and which mounts the same storage with the
        same spec, is joined instead of replaced. A live owner's container
        that does not match is left alone.

        Raises:
            EngineError: The engine refused.
        """
        async with self._lock:
            joinable: list[tuple[str, bool]] = []
            for box in await self._engine.list_containers({LABEL_WORKSPACE: self._workspace}):
                alive = owner_alive(box.labels)
                if not box.running or alive is False:
                    await self._engine.remove(box.id)
                elif self._matches(box.labels):
                    joinable.append((box.id, owned_here(box.labels)))
            if joinable:
                # Prefer this process's own container: it outlives our other handles.
                cid, owned = max(joinable, key=lambda found: found[1])
                return self._take(cid, owned=owned)
            return self._take(await self._create(), owned=True)

    def _matches(self, labels: Mapping[str, str]) -> bool:
        return all(
            labels.get(key) == self._labels.get(key)
            for key in (LABEL_SPEC, LABEL_ROOT, LABEL_WORKSPACE)
        )

    def _take(self, container_id: str, *, owned: bool) -> str:
        _hold(container_id)
        self._id, self._owned = container_id, owned
        return container_id

    def detach(self) -> str | None:
        """Stop holding the container without removing it (the pool keeps it); its id."""
        cid, self._id = self._id, None
        if cid is not None:
            _release(cid)
        return cid

    def adopt(self, container_id: str) -> None:
        """Take over an already started container (from the pool)."""
        self._take(container_id, owned=True)

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
        """Let go of the container; idempotent.

        The container is stopped and removed when this was its last handle
        in this process and this process owns it; another process's
        container stays for its owner.
        """
        self._closed = True
        async with self._lock:
            cid, self._id = self._id, None
            if cid is not None and _release(cid) and self._owned:
                await self._engine.remove(cid)
