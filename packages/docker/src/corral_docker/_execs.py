"""What every exec a docker workspace starts shares: the tree's sweep, the engine's errors.

The shell's commands, background processes and code contexts each run as
an exec carrying a random marker (``CORRAL_EXEC``) in its environment.
Ending one kills every process of the container whose environment holds
that marker, so a whole tree dies, ``setsid`` or not; docker's init (tini)
reaps them. A child that scrubs its environment (``env -i``) escapes the
marker but not the container's removal when the workspace closes.

Starting an exec fails the same way for all of them: a container that is
gone evicts the workspace, any other engine error fails the operation with
the engine's words.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Final

import anyio

from corral.provider import OperationError, WorkspaceEvictedError

from ._attach import AttachingEngine
from ._engine import ContainerNotFoundError, DockerEngine, EngineError

__all__ = ["KILL_MARKED", "engine_errors", "kill_marked", "require_attaching"]

KILL_MARKED: Final = (
    "m=CORRAL_EXEC=$1; for pass in 1 2 3; do for p in /proc/[0-9]*; do "
    '[ "${p#/proc/}" = "$$" ] && continue; '
    "if tr '\\000' '\\n' < $p/environ 2>/dev/null | grep -qxF \"$m\"; then "
    'kill -9 "${p#/proc/}" 2>/dev/null; fi; done; done; true'
)
"""Kills every process whose environment carries the marker (``$1``); repeated so a
process forking during the sweep is caught on the next pass."""


async def kill_marked(
    engine: DockerEngine,
    container_id: str,
    markers: Sequence[str],
    *,
    user: str,
    wait_s: float,
) -> None:
    """Kill every process of the execs marked ``markers`` (best effort, shielded).

    Shielded, so a cancelled caller still ends what it started; bounded by
    ``wait_s`` in all, so a wedged engine cannot hold the caller. Engine
    errors are swallowed: the container's removal is the backstop.
    """
    with anyio.move_on_after(wait_s, shield=True):
        for marker in markers:
            with contextlib.suppress(EngineError):
                await engine.exec(
                    container_id,
                    ["sh", "-c", KILL_MARKED, "corral-kill", marker],
                    env={},
                    workdir="/",
                    user=user,
                    max_output_bytes=4096,
                )


@contextlib.contextmanager
def engine_errors(what: str) -> Iterator[None]:
    """Turn the engine's errors inside the block into the errors a caller gets.

    Args:
        what: The message's head (``"docker exec failed"``); the engine's
            own message follows it.

    Raises:
        WorkspaceEvictedError: The workspace's container is gone.
        OperationError: ``failed``, for any other engine error.
    """
    try:
        yield
    except ContainerNotFoundError:
        raise WorkspaceEvictedError(
            "docker: the workspace container is gone", provider_id="docker"
        ) from None
    except EngineError as exc:
        raise OperationError(f"{what}: {exc.message}", code="failed") from None


def require_attaching(engine: DockerEngine, module: str) -> AttachingEngine:
    """``engine``, checked to attach exec streams (what a long-lived exec talks over).

    Raises:
        TypeError: The engine cannot attach streams; ``module`` names who needs it.
    """
    if not isinstance(engine, AttachingEngine):
        raise TypeError(f"{module} needs an engine that attaches exec streams")
    return engine
