"""Which interpreters a docker image has: one probe, read by ``code`` and ``script``.

Both modules promise only languages the box really has, so both ask the
running container which programs are on its ``PATH``; the question and its
parsing live here once, and each module turns the answer into its own
languages (:func:`code_languages`, :func:`script_languages`). An image is
probed once per provider and per cache: the answer is a property of the
image, not of one container.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import anyio

from corral_posix._scriptdriver import LANGUAGE_PROGRAMS

from ._engine import DockerEngine

__all__ = ["code_languages", "image_interpreters", "script_languages"]

_PROGRAMS: Final = ("python3", "bash", "node")
_PROBE: Final = (
    "; ".join(f"command -v {p} >/dev/null 2>&1 && echo {p}" for p in _PROGRAMS) + "; true"
)
_PROBE_WAIT_S: Final = 60.0
_CODE_PROGRAMS: Final = {"bash": "bash", "javascript": "node"}
"""The sessions the code driver hosts, beside python, and the program each needs."""


async def probe_interpreters(
    engine: DockerEngine, container_id: str, *, user: str
) -> frozenset[str]:
    """The interpreters (``python3``, ``bash``, ``node``) on the running container's PATH.

    Raises:
        EngineError: The engine refused or is unreachable.
    """
    with anyio.fail_after(_PROBE_WAIT_S):
        out = await engine.exec(
            container_id,
            ["sh", "-c", _PROBE],
            env={},
            workdir="/",
            user=user,
            max_output_bytes=4096,
        )
    found = out.stdout.decode("ascii", "replace").split()
    return frozenset(p for p in found if p in _PROGRAMS)


async def image_interpreters(
    engine: DockerEngine,
    container: Callable[[], Awaitable[str]],
    *,
    user: str,
    image: str,
    probed: dict[str, frozenset[str]],
) -> frozenset[str]:
    """:func:`probe_interpreters` for ``image``, once: ``probed`` caches it per image.

    Raises:
        EngineError: The probe failed.
    """
    programs = probed.get(image)
    if programs is None:
        programs = await probe_interpreters(engine, await container(), user=user)
        probed[image] = programs
    return programs


def code_languages(programs: frozenset[str]) -> frozenset[str]:
    """The ``code`` languages: none without python3 (the driver is Python), else its sessions."""
    if "python3" not in programs:
        return frozenset()
    extra = {lang for lang, program in _CODE_PROGRAMS.items() if program in programs}
    return frozenset({"python", *extra})


def script_languages(programs: frozenset[str]) -> frozenset[str]:
    """The ``script`` languages: each one whose interpreter the image has."""
    return frozenset(lang for lang, program in LANGUAGE_PROGRAMS.items() if program in programs)
