"""The real DockerEngine: the Docker SDK, its blocking calls run on worker threads.

This is the only module that imports ``docker``. Errors are translated into
:class:`~corral_docker.EngineError` subclasses with a ``transient`` flag:
timeouts and 5xx answers may heal on retry; a missing daemon, a missing
image or a 4xx answer will not.
"""

from __future__ import annotations

import functools
import io
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from corral.provider import TerminalSize, current_progress_callback, echo_if_short

from ._attach import AttachedExec, open_attached
from ._engine import (
    ContainerInfo,
    ContainerNotFoundError,
    ContainerSpec,
    EngineClientMissingError,
    EngineError,
    EngineUnavailableError,
    ExecOutput,
    ImageNotFoundError,
    PullProgress,
)

__all__ = ["SdkEngine"]

T = TypeVar("T")

_CLIENT_TIMEOUT_S = 60


def _translate(exc: BaseException, what: str) -> EngineError:
    import docker.errors
    import requests.exceptions

    if isinstance(exc, EngineError):
        return exc
    if isinstance(exc, docker.errors.ImageNotFound):
        return ImageNotFoundError(f"{what}: image not found")
    if isinstance(exc, docker.errors.NotFound):
        return ContainerNotFoundError(f"{what}: not found")
    if isinstance(exc, requests.exceptions.Timeout):
        return EngineError(f"{what}: the Docker daemon timed out", transient=True)
    if isinstance(exc, requests.exceptions.ConnectionError | ConnectionError | FileNotFoundError):
        return EngineUnavailableError(f"{what}: cannot reach the Docker daemon")
    if isinstance(exc, docker.errors.APIError):
        status = exc.status_code or 0
        transient = status >= 500 or status == 409
        return EngineError(f"{what}: Docker API error {status}", transient=transient)
    if isinstance(exc, docker.errors.DockerException):
        return EngineUnavailableError(f"{what}: cannot reach the Docker daemon")
    return EngineError(f"{what}: {type(exc).__name__}", transient=False)


class SdkEngine:
    """A :class:`~corral_docker.DockerEngine` backed by the Docker SDK.

    Args:
        base_url: ``unix:///var/run/docker.sock``, ``tcp://host:2376`` or
            ``ssh://user@host`` (paramiko, the ``ssh`` extra). ``None`` uses
            ``DOCKER_HOST`` or the local socket.
        timeout_s: Per-request timeout of the SDK.
    """

    def __init__(
        self, base_url: str | None = None, *, timeout_s: float = _CLIENT_TIMEOUT_S
    ) -> None:
        self._base_url = base_url
        self._timeout_s = timeout_s
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str | None:
        """The configured daemon address."""
        return self._base_url

    @property
    def remote(self) -> bool:
        """Whether the daemon is on another host (ssh:// or tcp:// addresses)."""
        url = self._base_url or ""
        return url.startswith(("ssh://", "tcp://", "http://", "https://"))

    def _api(self) -> Any:
        with self._lock:
            if self._client is None:
                _probe_unix_socket(self._base_url)
                import docker

                if self._base_url and self._base_url.startswith("ssh://"):
                    try:
                        import paramiko  # noqa: F401
                    except ImportError:
                        raise EngineClientMissingError(
                            "ssh:// Docker engines need paramiko: pip install 'corral-docker[ssh]'"
                        ) from None
                kwargs: dict[str, Any] = {"timeout": int(self._timeout_s)}
                if self._base_url:
                    self._client = docker.APIClient(base_url=self._base_url, **kwargs)
                else:
                    from docker.utils import kwargs_from_env

                    self._client = docker.APIClient(**kwargs_from_env(), **kwargs)
            return self._client

    async def _call(self, what: str, fn: Callable[[Any], T], *, abandon: bool = False) -> T:
        def run() -> T:
            try:
                return fn(self._api())
            except Exception as exc:
                raise _translate(exc, what) from exc

        return await anyio.to_thread.run_sync(run, abandon_on_cancel=abandon)

    async def ping(self) -> None:
        """Check that the daemon answers."""
        await self._call("ping", lambda api: api.ping())

    async def ensure_image(self, image: str, *, pull: bool) -> None:
        """Make sure ``image`` is present, pulling it when allowed.

        The pull is read as the daemon's event stream, which feeds ``pull``
        progress (:class:`~corral_docker.PullProgress`) and carries the
        errors a registry reports after the request was accepted.
        """
        import docker.errors

        # The image name comes from the operator's options; the registry's own
        # error text does not reach the message, only its class.
        shown = echo_if_short(image, limit=200, fallback="(configured image)")
        callback = current_progress_callback()

        def run(api: Any) -> None:
            try:
                api.inspect_image(image)
            except docker.errors.ImageNotFound:
                if not pull:
                    raise ImageNotFoundError(
                        f"image {shown}; pulling is off (pull=False)"
                    ) from None
            else:
                return
            repo, _, tag = (
                image.rpartition(":")
                if ":" in image.rsplit("/", maxsplit=1)[-1]
                else (image, "", "")
            )
            progress = PullProgress(callback)
            try:
                for event in api.pull(repo, tag=tag or "latest", stream=True, decode=True):
                    if not isinstance(event, dict):
                        continue
                    if "error" in event:
                        # A failure after the request was accepted (manifest or
                        # layer missing, registry gone); its text is not ours to show.
                        raise ImageNotFoundError(
                            f"image {shown}; pull: the registry or daemon reported an error "
                            "partway through"
                        )
                    progress.feed(event)
            except docker.errors.APIError as exc:
                raise ImageNotFoundError(f"image {shown}; pull: {_pull_reason(exc)}") from None
            progress.finish()

        await self._call("ensure image", run)

    async def create(self, spec: ContainerSpec) -> str:
        """Create a container from a hardened spec and return its id."""

        def run(api: Any) -> str:
            import docker.types

            mounts = [
                docker.types.Mount(
                    target=m.target,
                    source=m.source,
                    type=m.kind,
                    read_only=m.read_only,
                    # Without nocopy Docker copies the image's directory (and its
                    # owner) into an empty volume at every mount, undoing init_volume.
                    no_copy=m.kind == "volume",
                )
                for m in spec.mounts
            ]
            host_config = api.create_host_config(
                mounts=mounts,
                network_mode=spec.network_mode,
                read_only=spec.read_only_rootfs,
                tmpfs=dict(spec.tmpfs),
                cap_drop=list(spec.cap_drop),
                cap_add=list(spec.cap_add) or None,
                security_opt=list(spec.security_opt),
                init=spec.init,
                pids_limit=spec.pids_limit,
                mem_limit=spec.memory_bytes,
                memswap_limit=spec.memory_swap_bytes,
                nano_cpus=spec.nano_cpus,
                ulimits=[
                    docker.types.Ulimit(name=u.name, soft=u.soft, hard=u.hard) for u in spec.ulimits
                ],
                runtime=spec.runtime,
                privileged=False,
                # cgroup v1 engines default to the host cgroup namespace.
                cgroupns="private",
                ipc_mode="private",
            )
            created = api.create_container(
                image=spec.image,
                command=list(spec.command),
                name=spec.name,
                user=spec.user,
                working_dir=spec.working_dir,
                labels=dict(spec.labels),
                environment=dict(spec.environment),
                host_config=host_config,
                network_disabled=spec.network_mode == "none",
                stdin_open=False,
                tty=False,
            )
            return str(created["Id"])

        return await self._call("create container", run)

    async def start(self, container_id: str) -> None:
        """Start a created container."""
        await self._call("start container", lambda api: api.start(container_id))

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
        """Run ``argv`` in the container, streaming and capping its output.

        The exec runs attached (:mod:`corral_docker._attach`), read from the
        hijacked connection by our own reader. Not the SDK's ``exec_start``:
        its frame reader reads the socket (or ssh channel) under the HTTP
        parser's buffer, so output the daemon sent in the same packet as its
        ``101`` answer -- a short command's whole output and, over ssh, its
        exit trailer, most often on a loaded host -- was silently dropped.

        Over ssh every new connection spawns ``docker system dial-stdio`` on
        the remote host, so remote execs report their status in a stderr
        trailer instead of paying for an ``exec inspect``; when the trailer
        does not come back, and always on a local engine, the engine's
        record is waited for (:func:`~corral_docker._attach.wait_exit_code`).

        The read is abandoned on cancellation (the caller kills the process
        tree); closing the connection ends its thread.

        Raises:
            EngineError: The engine failed, or never reported the exit status.
        """
        attached = await self.attach_exec(
            container_id,
            argv,
            env=env,
            workdir=workdir,
            user=user,
            stdin=False,
            exit_trailer=self.remote,
        )
        out = _CappedBuffer(max_output_bytes)
        err = _CappedBuffer(max_output_bytes)

        def drain() -> None:
            while (chunks := attached.receive_blocking()) is not None:
                for name, data in chunks:
                    (out if name == "stdout" else err).add(data)

        try:
            await anyio.to_thread.run_sync(drain, abandon_on_cancel=True)
            code = await attached.exit_code()
        finally:
            await attached.aclose()
        return ExecOutput(
            exit_code=code,
            stdout=out.value(),
            stderr=err.value(),
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
        )

    async def attach_exec(
        self,
        container_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        workdir: str,
        user: str,
        stdin: bool,
        terminal: TerminalSize | None = None,
        exit_trailer: bool = False,
    ) -> AttachedExec:
        """Start an exec with its streams attached (see :mod:`corral_docker._attach`)."""
        return await open_attached(
            self._call,
            container_id,
            argv,
            env=env,
            workdir=workdir,
            user=user,
            stdin=stdin,
            terminal=terminal,
            exit_trailer=exit_trailer,
        )

    async def stop(self, container_id: str, *, timeout_s: float) -> None:
        """Stop a container."""
        await self._call(
            "stop container", lambda api: api.stop(container_id, timeout=int(timeout_s))
        )

    async def remove(self, container_id: str) -> None:
        """Force-remove a container; a missing one is fine."""
        try:
            await self._call(
                "remove container", lambda api: api.remove_container(container_id, force=True)
            )
        except ContainerNotFoundError:
            return

    async def inspect(self, container_id: str) -> ContainerInfo:
        """Describe one container."""
        raw = await self._call("inspect container", lambda api: api.inspect_container(container_id))
        return _info(raw)

    async def list_containers(self, labels: Mapping[str, str]) -> list[ContainerInfo]:
        """Containers carrying every label of ``labels`` (``""`` matches any value)."""
        filters = [f"{k}={v}" if v else k for k, v in labels.items()]

        def run(api: Any) -> list[ContainerInfo]:
            found = api.containers(all=True, filters={"label": filters})
            return [
                ContainerInfo(
                    id=c["Id"],
                    name=(c.get("Names") or ["/"])[0].lstrip("/"),
                    labels=c.get("Labels") or {},
                    running=c.get("State") == "running",
                )
                for c in found
            ]

        return await self._call("list containers", run)

    async def create_volume(self, name: str, labels: Mapping[str, str]) -> None:
        """Create a named volume."""
        await self._call(
            "create volume", lambda api: api.create_volume(name=name, labels=dict(labels))
        )

    async def remove_volume(self, name: str) -> None:
        """Remove a named volume; a missing one is fine."""
        try:
            await self._call("remove volume", lambda api: api.remove_volume(name, force=True))
        except ContainerNotFoundError:
            return

    async def volume_exists(self, name: str) -> bool:
        """Whether a named volume exists."""
        try:
            await self._call("inspect volume", lambda api: api.inspect_volume(name))
        except ContainerNotFoundError:
            return False
        return True

    async def put_archive(self, container_id: str, path: str, data: bytes) -> None:
        """Extract a tar archive into a directory of the container."""

        def run(api: Any) -> None:
            if not api.put_archive(container_id, path, data):
                raise EngineError("put archive: refused by the daemon")

        await self._call("put archive", run)

    async def get_archive(self, container_id: str, path: str, *, max_bytes: int) -> bytes:
        """A tar archive of ``path``; refuses archives larger than ``max_bytes``."""

        def run(api: Any) -> bytes:
            stream, _stat = api.get_archive(container_id, path, chunk_size=256 * 1024)
            buf = io.BytesIO()
            for chunk in stream:
                buf.write(chunk)
                if buf.tell() > max_bytes:
                    raise EngineError("get archive: larger than the configured cap")
            return buf.getvalue()

        return await self._call("get archive", run)

    async def aclose(self) -> None:
        """Close the SDK client."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            await anyio.to_thread.run_sync(functools.partial(client.close))


def _pull_reason(exc: Any) -> str:
    """Why a pull failed, from the status code only (the registry's text is not ours)."""
    status = getattr(exc, "status_code", None) or 0
    if status == 404:
        return "404: no such repository or tag, or it needs docker login"
    if status in (401, 403):
        return f"{status}: access denied; docker login to the registry"
    if status >= 500:
        return f"{status}: the registry or daemon failed, or has no network"
    return f"Docker API error {status}" if status else "Docker API error"


def daemon_problem(base_url: str | None = None, *, timeout_s: float = 3.0) -> str | None:
    """Whether a Docker daemon answers here now (blocking, bounded by ``timeout_s``).

    Returns:
        None when ``ping`` succeeds, else a one-line reason with advice.
    """
    engine = SdkEngine(base_url, timeout_s=timeout_s)
    try:
        engine._api().ping()
    except EngineClientMissingError as exc:
        return exc.message
    except Exception:
        where = base_url or os.environ.get("DOCKER_HOST") or "the local socket"
        shown = echo_if_short(where, limit=200, fallback="the configured address")
        return f"no Docker daemon answers at {shown}; start dockerd or set DOCKER_HOST"
    finally:
        if engine._client is not None:
            engine._client.close()
    return None


def _probe_unix_socket(base_url: str | None) -> None:
    """Fail fast, and without the SDK, when a local socket does not answer.

    The SDK leaks the socket of a refused unix connection (a ResourceWarning
    at garbage collection), and "no daemon" is the common failure here.
    """
    url = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not url.startswith("unix://"):
        return
    path = url.removeprefix("unix://")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(5)
        try:
            probe.connect(path)
        except OSError:
            raise EngineUnavailableError("cannot reach the Docker daemon") from None


class _CappedBuffer:
    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._parts: list[bytes] = []
        self._size = 0
        self.truncated = False

    def add(self, chunk: bytes) -> None:
        room = self._cap - self._size
        if room <= 0:
            self.truncated = True
            return
        if len(chunk) > room:
            chunk = chunk[:room]
            self.truncated = True
        self._parts.append(chunk)
        self._size += len(chunk)

    def value(self) -> bytes:
        return b"".join(self._parts)


def _info(raw: Mapping[str, Any]) -> ContainerInfo:
    config = raw.get("Config") or {}
    state = raw.get("State") or {}
    return ContainerInfo(
        id=str(raw.get("Id", "")),
        name=str(raw.get("Name", "")).lstrip("/"),
        labels=config.get("Labels") or {},
        running=bool(state.get("Running")),
        raw=raw,
    )
