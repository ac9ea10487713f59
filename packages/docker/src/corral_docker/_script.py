"""The ``script`` module of docker: one script per fresh container.

Each call creates a container from the workspace's image with the
workspace's hardening (:func:`build_container_spec`: capabilities dropped,
no-new-privileges, init, pids/memory/CPU limits, ulimits, the same user,
read-only root when the workspace has one) and three differences: no mount
at all (nothing of the workspace, no volume), ``--network none`` whatever
the workspace allows, and its working directory is the private tmpfs. The
container idles on a ``sleep`` bounded by the timeout (a leaked one stops by
itself), the interpreter (``python3 -I`` or ``node``) runs in it as an
attached exec fed the driver of :mod:`corral_posix._scriptdriver` on stdin,
and the container is force-removed when the call ends: at the timeout that
kills every process the script started. The driver's result frame is the
last line of stderr (a container has no spare fd to pass); the host keeps
the stream's tail to find it, whatever the script printed before.
"""

from __future__ import annotations

import contextlib
import math
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import anyio
import attrs

from corral.provider import ExecResult, OperationError
from corral_posix._capture import truncation_marker
from corral_posix._scriptbox import BoxRun, BoxScriptRunner, frame_cap
from corral_posix._scriptdriver import find_frame

from ._attach import AttachedExec
from ._engine import DockerEngine, EngineError, MountSpec
from ._execs import require_attaching
from ._interpreters import image_interpreters, script_languages
from ._labels import LABEL_MANAGED, LABEL_ROOT, LABEL_WORKSPACE
from ._options import CONTAINER_TMP, DockerOptions, build_container_spec

__all__ = ["DockerScriptRunner", "build_docker_script"]

LABEL_SCRIPT: Final = "io.corral.script"
_MIB: Final = 1 << 20
_REMOVE_WAIT_S: Final = 30.0
_KEEPER_GRACE_S: Final = 120


class _Stream:
    """One output stream: the head up to the cap, and a tail kept for the frame."""

    def __init__(self, cap: int, tail: int) -> None:
        self.cap = cap
        self.head = bytearray()
        self.tail = bytearray()
        self.keep_tail = tail
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap + 1 - len(self.head)
        if room > 0:
            self.head += data[:room]
        self.tail += data
        if len(self.tail) > self.keep_tail:
            del self.tail[: len(self.tail) - self.keep_tail]

    def whole(self) -> bytes | None:
        """Every byte, when the stream was short enough to keep whole."""
        return bytes(self.tail) if self.total <= self.keep_tail else None

    def text(self, data: bytes) -> tuple[str, bool]:
        if len(data) <= self.cap:
            return data.decode(errors="replace"), False
        kept = data[: self.cap].decode(errors="ignore")
        return kept + truncation_marker(self.cap), True


class DockerScriptRunner(BoxScriptRunner):
    """Runs each script in a fresh container that sees nothing of the workspace.

    Results are :class:`~corral_posix._scriptbox.BoxScriptRunner`'s; an
    interpreter killed before it reported (the memory limit's SIGKILL,
    typically) is a ``Killed`` error.

    Args:
        engine: The workspace's engine (it must attach exec streams).
        options: The workspace's container options (image, limits, user).
        labels: Labels of each script container (owner and workspace, so gc
            and the workspace's removal find a leaked one).
        languages: The image's script languages (see :mod:`._interpreters`).
        max_output_bytes: Cap of stdout, of stderr and of the result's JSON.
        max_timeout_s: Ceiling of a run's timeout.
    """

    def __init__(
        self,
        engine: DockerEngine,
        options: DockerOptions,
        *,
        labels: Mapping[str, str],
        languages: frozenset[str],
        max_output_bytes: int = _MIB,
        max_timeout_s: float = 60.0,
    ) -> None:
        super().__init__(
            languages,
            box="a fresh container per call: no mounts, network none",
            missing="none: the image has neither python3 nor node (use one that has, e.g. "
            "corral-python:bookworm)",
            max_output_bytes=max_output_bytes,
            max_timeout_s=max_timeout_s,
            sigkill_note=" (the container's memory limit, most likely)",
        )
        self._engine = engine
        self._attaching = require_attaching(engine, "the script runner")
        self._options = options
        self._labels = {**labels, LABEL_SCRIPT: "1"}

    async def _run_box(self, language: str, code: str, timeout_s: float) -> BoxRun:
        """One container: the driver on the exec's stdin, its frame in stderr's tail.

        Raises:
            OperationError: ``failed`` when the engine refused to run the container.
        """
        program = self._program(language, code, channel_fd=2)
        out = _Stream(self._cap, self._cap)
        err = _Stream(self._cap, self._cap + frame_cap(self._cap))
        container_id: str | None = None
        started = anyio.current_time()
        timed_out = False
        exit_code: int | None = None
        try:
            container_id = await self._engine.create(self._spec(timeout_s))
            await self._engine.start(container_id)
            attached = await self._attaching.attach_exec(
                container_id,
                list(program.argv),
                env={},
                workdir=CONTAINER_TMP,
                user=self._options.user,
                stdin=True,
            )
            try:
                with anyio.move_on_after(timeout_s) as scope:
                    await _feed_and_read(attached, program.stdin.encode(), out, err)
                timed_out = scope.cancelled_caught
                if not timed_out:
                    exit_code = await attached.exit_code()
            finally:
                await attached.aclose()
        except EngineError as exc:
            raise OperationError(
                f"the script's container could not run: {exc.message}", code="failed"
            ) from None
        finally:
            if container_id is not None:
                await _remove(self._engine, container_id)
        duration_ms = (anyio.current_time() - started) * 1000.0
        stdout, out_cut = out.text(bytes(out.head))
        frame, rest = find_frame(bytes(err.tail), program.marker)
        # The frame is cut out of stderr only when all of stderr was kept.
        stderr, err_cut = err.text(rest if err.whole() is not None else bytes(err.head))
        # An exec's status above 128 is the signal that killed the interpreter.
        signal = exit_code - 128 if exit_code is not None and exit_code > 128 else None
        result = ExecResult(
            exit_code=None if signal is not None else exit_code,
            stdout=stdout,
            stderr=stderr,
            stdout_truncated=out_cut,
            stderr_truncated=err_cut,
            duration_ms=duration_ms,
            signal=signal,
            timed_out=timed_out,
        )
        return BoxRun(result, frame)

    def _spec(self, timeout: float) -> Any:
        opts = self._options
        # build_container_spec is the one place hardening is decided; only the
        # mount, the network and the keeper's lifetime differ here.
        base = build_container_spec(
            opts,
            name=f"corral-script-{secrets.token_hex(8)}",
            labels=self._labels,
            mount=MountSpec("volume", "unused", "/unused"),
        )
        keeper = str(math.ceil(timeout) + _KEEPER_GRACE_S)
        return attrs.evolve(
            base,
            mounts=(),
            network_mode="none",
            working_dir=CONTAINER_TMP,
            command=("sleep", keeper),
        )


async def _feed_and_read(
    attached: AttachedExec, program: bytes, out: _Stream, err: _Stream
) -> None:
    """Send the program (then EOF) while reading both streams to their end."""

    async def feed() -> None:
        await attached.send(program)
        await attached.close_stdin()

    async with anyio.create_task_group() as tg:
        tg.start_soon(feed)
        while True:
            chunks = await attached.receive()
            if chunks is None:
                break
            for stream, data in chunks:
                (out if stream == "stdout" else err).add(data)
        tg.cancel_scope.cancel()


async def _remove(engine: DockerEngine, container_id: str) -> None:
    """Force-remove the box (kills everything in it); never masks the call's outcome."""
    # On failure gc removes it: its labels name the workspace and the owner.
    with (
        anyio.CancelScope(shield=True),
        anyio.move_on_after(_REMOVE_WAIT_S),
        contextlib.suppress(EngineError),
    ):
        await engine.remove(container_id)


ContainerGetter = Callable[[], Awaitable[str]]
"""Returns the id of the workspace's running container (for the language probe)."""


async def build_docker_script(
    engine: DockerEngine,
    container: ContainerGetter,
    options: DockerOptions,
    *,
    labels: Mapping[str, str],
    workspace: str,
    root: str | None,
    probed: dict[str, frozenset[str]],
) -> DockerScriptRunner:
    """The ``script`` module of one workspace; the image's languages are probed once.

    Args:
        engine: The workspace's engine.
        container: Returns the workspace's running container (the probe runs there).
        options: The workspace's container options.
        labels: The owner (and session) labels of the workspace's container.
        workspace: The workspace's name: its script boxes are labelled with
            it, so removing the workspace (or gc) removes a leaked one. They
            carry no spec label, so nothing mistakes one for the workspace's
            own container.
        root: The workspace's host directory (local engines), for gc.
        probed: The provider's interpreters per image, filled here.

    Raises:
        EngineError: The probe failed.
    """
    programs = await image_interpreters(
        engine, container, user=options.user, image=options.image, probed=probed
    )
    box_labels = {
        **labels,
        LABEL_MANAGED: "1",
        LABEL_WORKSPACE: workspace,
        **({LABEL_ROOT: root} if root else {}),
    }
    return DockerScriptRunner(
        engine, options, labels=box_labels, languages=script_languages(programs)
    )
