"""FakeDockerEngine: a recording, daemon-free DockerEngine for unit tests."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import attrs

from ._engine import (
    ContainerInfo,
    ContainerNotFoundError,
    ContainerSpec,
    EngineError,
    EngineUnavailableError,
    ExecOutput,
    ImageNotFoundError,
    PullProgress,
)

__all__ = ["ExecCall", "FakeDockerEngine"]


@attrs.frozen
class ExecCall:
    """One recorded exec."""

    container_id: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    workdir: str
    user: str


ExecHandler = Callable[[ExecCall], ExecOutput]


class FakeDockerEngine:
    """Records every call and keeps containers and volumes in memory.

    Args:
        images: Images that are present.
        pullable: Images a pull would fetch.
        pull_layers: Layer sizes in bytes of every pull; a pull plays the
            Engine API's event stream for them (in ``pull_chunk_bytes``
            steps) through :class:`PullProgress`, as the real engine does.
        remote: Report a remote engine.
        exec_handler: Computes exec results (default: exit 0, no output).

    Attributes:
        calls: ``(method, args)`` in call order.
        specs: Container specs by id, as created.
        fail_next: Method name -> error raised by its next call.
        down: While True every call raises :class:`EngineUnavailableError`.
        exec_delay_s: Sleep this long in every exec (to exercise timeouts).
    """

    def __init__(
        self,
        *,
        images: Sequence[str] = ("corral-test:latest",),
        pullable: Sequence[str] = (),
        pull_layers: Sequence[int] = (3 << 20, 5 << 20, 1 << 20),
        remote: bool = False,
        exec_handler: ExecHandler | None = None,
    ) -> None:
        self.images = set(images)
        self.pullable = set(pullable)
        self.pull_layers = tuple(pull_layers)
        self.pull_chunk_bytes = 512 * 1024
        self._remote = remote
        self.exec_handler: ExecHandler = exec_handler or (lambda _c: ExecOutput(exit_code=0))
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.specs: dict[str, ContainerSpec] = {}
        self.running: dict[str, bool] = {}
        self.volumes: dict[str, Mapping[str, str]] = {}
        self.archives: list[tuple[str, str, bytes]] = []
        self.execs: list[ExecCall] = []
        self.fail_next: dict[str, EngineError] = {}
        self.down = False
        self.exec_delay_s = 0.0
        self.closed = False

    @property
    def remote(self) -> bool:
        """Whether this fake pretends to be a remote engine."""
        return self._remote

    def _enter(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))
        if self.down:
            raise EngineUnavailableError(f"{method}: cannot reach the Docker daemon")
        err = self.fail_next.pop(method, None)
        if err is not None:
            raise err

    def _need(self, container_id: str) -> ContainerSpec:
        spec = self.specs.get(container_id)
        if spec is None:
            raise ContainerNotFoundError("container not found")
        return spec

    def called(self, method: str) -> list[tuple[Any, ...]]:
        """Arguments of every call of ``method``."""
        return [args for name, args in self.calls if name == method]

    async def ping(self) -> None:
        """Answer unless down."""
        self._enter("ping")

    async def ensure_image(self, image: str, *, pull: bool) -> None:
        """Present, or pulled when pullable and allowed."""
        self._enter("ensure_image", image, pull)
        if image in self.images:
            return
        if pull and image in self.pullable:
            progress = PullProgress()
            for event in self.pull_events():
                progress.feed(event)
                await anyio.lowlevel.checkpoint()
            progress.finish()
            self.images.add(image)
            return
        raise ImageNotFoundError("image not found")

    def pull_events(self) -> list[dict[str, Any]]:
        """The event stream a pull of :attr:`pull_layers` plays, in the Engine API's shape."""
        layers = [(f"layer{i:02d}", size) for i, size in enumerate(self.pull_layers)]
        events: list[dict[str, Any]] = [{"status": "Pulling from fake/image", "id": "latest"}]
        events += [
            {"status": "Pulling fs layer", "progressDetail": {}, "id": lid} for lid, _ in layers
        ]
        for lid, size in layers:
            current = 0
            while current < size:
                current = min(size, current + self.pull_chunk_bytes)
                events.append(
                    {
                        "status": "Downloading",
                        "progressDetail": {"current": current, "total": size},
                        "id": lid,
                    }
                )
            events.append({"status": "Download complete", "progressDetail": {}, "id": lid})
        events += [
            {"status": "Pull complete", "progressDetail": {}, "id": lid} for lid, _ in layers
        ]
        events.append({"status": "Status: Downloaded newer image for fake/image:latest"})
        return events

    async def create(self, spec: ContainerSpec) -> str:
        """Record the spec and return a new id."""
        self._enter("create", spec)
        if spec.image not in self.images:
            raise ImageNotFoundError("image not found")
        cid = secrets.token_hex(32)
        self.specs[cid] = spec
        self.running[cid] = False
        return cid

    async def start(self, container_id: str) -> None:
        """Mark a container running."""
        self._enter("start", container_id)
        self._need(container_id)
        self.running[container_id] = True

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
        """Record the exec and return what the handler computes."""
        self._enter("exec", container_id, tuple(argv))
        self._need(container_id)
        if not self.running.get(container_id):
            raise EngineError("exec: container is not running", transient=False)
        call = ExecCall(container_id, tuple(argv), dict(env), workdir, user)
        self.execs.append(call)
        if self.exec_delay_s:
            await anyio.sleep(self.exec_delay_s)
        out = self.exec_handler(call)
        return attrs.evolve(
            out,
            stdout=out.stdout[:max_output_bytes],
            stderr=out.stderr[:max_output_bytes],
            stdout_truncated=out.stdout_truncated or len(out.stdout) > max_output_bytes,
            stderr_truncated=out.stderr_truncated or len(out.stderr) > max_output_bytes,
        )

    async def stop(self, container_id: str, *, timeout_s: float) -> None:
        """Mark a container stopped."""
        self._enter("stop", container_id, timeout_s)
        self._need(container_id)
        self.running[container_id] = False

    async def remove(self, container_id: str) -> None:
        """Forget a container; a missing one is fine."""
        self._enter("remove", container_id)
        self.specs.pop(container_id, None)
        self.running.pop(container_id, None)

    async def inspect(self, container_id: str) -> ContainerInfo:
        """Describe a container."""
        self._enter("inspect", container_id)
        spec = self._need(container_id)
        return ContainerInfo(
            id=container_id,
            name=spec.name,
            labels=dict(spec.labels),
            running=self.running[container_id],
            raw={"Config": {"Labels": dict(spec.labels)}},
        )

    async def list_containers(self, labels: Mapping[str, str]) -> list[ContainerInfo]:
        """Containers whose labels include ``labels`` (``""`` matches any value)."""
        self._enter("list_containers", dict(labels))
        out = []
        for cid, spec in self.specs.items():
            if all(k in spec.labels and (not v or spec.labels[k] == v) for k, v in labels.items()):
                out.append(
                    ContainerInfo(cid, spec.name, dict(spec.labels), running=self.running[cid])
                )
        return out

    async def create_volume(self, name: str, labels: Mapping[str, str]) -> None:
        """Record a volume."""
        self._enter("create_volume", name)
        self.volumes[name] = dict(labels)

    async def remove_volume(self, name: str) -> None:
        """Forget a volume."""
        self._enter("remove_volume", name)
        self.volumes.pop(name, None)

    async def volume_exists(self, name: str) -> bool:
        """Whether a volume was created and not removed."""
        self._enter("volume_exists", name)
        return name in self.volumes

    async def put_archive(self, container_id: str, path: str, data: bytes) -> None:
        """Record the upload."""
        self._enter("put_archive", container_id, path)
        self._need(container_id)
        self.archives.append((container_id, path, data))

    async def get_archive(self, container_id: str, path: str, *, max_bytes: int) -> bytes:
        """No container filesystem exists here."""
        self._enter("get_archive", container_id, path)
        self._need(container_id)
        raise ContainerNotFoundError("get archive: not found")

    async def aclose(self) -> None:
        """Record the close."""
        self.calls.append(("aclose", ()))
        self.closed = True
