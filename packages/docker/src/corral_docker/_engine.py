"""The DockerEngine seam: the only surface through which corral talks to Docker.

The provider, shell, file system and gc call this narrow protocol; the real
adapter (:class:`corral_docker.SdkEngine`) is the one place that imports the
Docker SDK, and :class:`corral_docker.FakeDockerEngine` drives unit tests
without a daemon.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from corral.provider import ProgressCallback, ProgressReporter

__all__ = [
    "ContainerInfo",
    "ContainerNotFoundError",
    "ContainerSpec",
    "DockerEngine",
    "EngineClientMissingError",
    "EngineError",
    "EngineUnavailableError",
    "ExecOutput",
    "ImageNotFoundError",
    "MountSpec",
    "PullProgress",
    "Ulimit",
]


class EngineError(Exception):
    """A Docker engine call failed.

    Args:
        message: What failed, without echoing untrusted data.
        transient: Retrying the same call later may succeed (daemon busy,
            timeout, 5xx).
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.transient = transient


class EngineUnavailableError(EngineError):
    """No daemon answers at the configured address."""


class EngineClientMissingError(EngineUnavailableError):
    """This side lacks what the configured address needs (paramiko for ssh://).

    Its message is the advice itself; "start dockerd" would be wrong here.
    """


class ImageNotFoundError(EngineError):
    """The image is neither present nor pullable."""


class ContainerNotFoundError(EngineError):
    """The container (or volume) does not exist (any more)."""


@attrs.frozen
class MountSpec:
    """One mount of a container.

    Attributes:
        kind: ``bind`` (a host directory; local engines only) or ``volume``
            (a named volume; works on remote engines).
        source: Host path or volume name.
        target: Path inside the container.
        read_only: Mount read-only.
    """

    kind: Literal["bind", "volume"]
    source: str
    target: str
    read_only: bool = False


@attrs.frozen
class Ulimit:
    """A resource limit applied to every process of the container."""

    name: str
    soft: int
    hard: int


@attrs.frozen
class ContainerSpec:
    """Everything needed to create a container; built only by ``build_container_spec``.

    There is deliberately no field for privileged mode, host namespaces or
    device access: the seam cannot express them.
    """

    image: str
    name: str
    command: tuple[str, ...]
    user: str
    working_dir: str
    labels: Mapping[str, str] = attrs.field(factory=dict)
    mounts: tuple[MountSpec, ...] = ()
    network_mode: str = "none"
    read_only_rootfs: bool = True
    tmpfs: Mapping[str, str] = attrs.field(factory=dict)
    cap_drop: tuple[str, ...] = ("ALL",)
    cap_add: tuple[str, ...] = ()
    security_opt: tuple[str, ...] = ("no-new-privileges",)
    init: bool = True
    pids_limit: int | None = None
    memory_bytes: int | None = None
    memory_swap_bytes: int | None = None
    nano_cpus: int | None = None
    ulimits: tuple[Ulimit, ...] = ()
    runtime: str | None = None
    environment: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class ExecOutput:
    """What an exec produced; ``exit_code`` is None when it never reported one."""

    exit_code: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False


@attrs.frozen
class ContainerInfo:
    """The engine's view of a container.

    Attributes:
        id: Full container id.
        name: Container name (without the leading ``/``).
        labels: Container labels.
        running: Whether its state is ``running``.
        raw: The engine's full inspect document (``docker inspect``), if fetched.
    """

    id: str
    name: str
    labels: Mapping[str, str] = attrs.field(factory=dict)
    running: bool = False
    raw: Mapping[str, Any] = attrs.field(factory=dict)


class PullProgress:
    """Turns the Engine API's pull stream into ``pull`` progress in bytes.

    The stream (``POST /images/create``) is one JSON object per event:
    ``{"id": layer, "status": "Downloading", "progressDetail": {"current":
    n, "total": m}}``, then ``Download complete``, ``Extracting``, ``Pull
    complete``; layers already present say ``Already exists`` and cost
    nothing. Progress counts downloaded bytes over the sizes of the layers
    seen downloading so far, so the total grows while layers start and
    ``done == total`` once every download completed. Events it does not
    know are ignored (the stream's vocabulary is the daemon's, not ours).

    Args:
        callback: Where reports go (default: the caller's
            :func:`corral.reporting_progress`).
    """

    def __init__(self, callback: ProgressCallback | None = None) -> None:
        self.reporter = ProgressReporter("pull", unit="bytes", callback=callback)
        self._done: dict[str, int] = {}
        self._total: dict[str, int] = {}

    @property
    def active(self) -> bool:
        """Whether anyone listens (a caller may skip decoding the stream otherwise)."""
        return self.reporter.active

    def feed(self, event: Mapping[str, Any]) -> None:
        """Account one event of the stream."""
        layer, status = event.get("id"), event.get("status")
        if not isinstance(layer, str) or not isinstance(status, str):
            return
        if status == "Downloading":
            detail = event.get("progressDetail")
            if not isinstance(detail, Mapping):
                return
            current, total = detail.get("current"), detail.get("total")
            # Exactly int: a bool or a negative count is not one.
            if type(current) is not int or type(total) is not int or min(current, total) < 0:
                return
            self._total[layer] = max(self._total.get(layer, 0), total)
            self._done[layer] = max(self._done.get(layer, 0), min(current, total))
        elif status in ("Download complete", "Pull complete") and layer in self._total:
            self._done[layer] = self._total[layer]
        else:
            return
        self.reporter.update(sum(self._done.values()), sum(self._total.values()))

    def finish(self) -> None:
        """Send the final report (the pull succeeded)."""
        self.reporter.update(sum(self._done.values()), sum(self._total.values()))
        self.reporter.finish()


@runtime_checkable
class DockerEngine(Protocol):
    """The calls corral makes on a Docker engine; each may raise :class:`EngineError`."""

    @property
    def remote(self) -> bool:
        """Whether the daemon runs on another host (host paths cannot be bind-mounted)."""
        ...

    async def ping(self) -> None:
        """Check that the daemon answers."""
        ...

    async def ensure_image(self, image: str, *, pull: bool) -> None:
        """Make sure ``image`` is present, pulling it when allowed.

        A pull reports ``pull`` progress (see :class:`PullProgress`) to the
        caller's :func:`corral.reporting_progress` callback.
        """
        ...

    async def create(self, spec: ContainerSpec) -> str:
        """Create a container and return its id."""
        ...

    async def start(self, container_id: str) -> None:
        """Start a created container."""
        ...

    async def exec(
        self,
        container_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        workdir: str,
        user: str,
        max_output_bytes: int,
    ) -> ExecOutput:
        """Run ``argv`` in a running container and wait for it to finish."""
        ...

    async def stop(self, container_id: str, *, timeout_s: float) -> None:
        """Stop a container (SIGTERM, then SIGKILL after ``timeout_s``)."""
        ...

    async def remove(self, container_id: str) -> None:
        """Force-remove a container; a missing one is not an error."""
        ...

    async def inspect(self, container_id: str) -> ContainerInfo:
        """Describe one container (with the raw inspect document)."""
        ...

    async def list_containers(self, labels: Mapping[str, str]) -> list[ContainerInfo]:
        """Containers (running or not) carrying all of ``labels``."""
        ...

    async def create_volume(self, name: str, labels: Mapping[str, str]) -> None:
        """Create a named volume (idempotent)."""
        ...

    async def remove_volume(self, name: str) -> None:
        """Remove a named volume; a missing one is not an error."""
        ...

    async def volume_exists(self, name: str) -> bool:
        """Whether a named volume exists."""
        ...

    async def put_archive(self, container_id: str, path: str, data: bytes) -> None:
        """Extract a tar archive into a directory of the container."""
        ...

    async def get_archive(self, container_id: str, path: str, *, max_bytes: int) -> bytes:
        """Return a tar archive of a path of the container (at most ``max_bytes``)."""
        ...

    async def aclose(self) -> None:
        """Release the client's connections."""
        ...
