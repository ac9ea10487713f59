"""What the ``fs`` contract cannot carry, carried through the box's shell: link targets and modes.

The ``FileSystem`` protocol reports a symlink (``stat``/``ls`` never follow
one) and every path's permission bits, but has no ``readlink``, ``symlink``
or ``chmod``. A version must still round-trip them, so the service asks the
box itself, with the portable tools every POSIX image has (``readlink``,
``ln -s``, ``chmod``; busybox included), run through the workspace's own
``shell`` module -- inside the box's boundary, under its guard, never on
the service's host paths.

Paths and targets never appear in a command line: they travel as
environment variables (``P0``, ``T0``...) the fixed command text quotes, so
no name can be parsed as shell syntax. Commands are batched by environment
size (the POSIX shells cap a command's environment at 128 KiB).

Never followed: a link's target is recorded as text, never read through
(``readlink`` prints the target; nothing opens it), so a link to ``/etc``
pulls nothing from outside into a version. Restored links are created with
``ln -s`` at paths whose parents are directories the restore itself made.
Modes are applied with ``chmod`` to files and directories only (never to a
link, which ``chmod`` would follow), masked to ``0o777`` -- no setuid,
setgid or sticky bit is planted -- and directories deepest first, after
their contents, so a read-only directory still receives its entries.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator, Sequence
from typing import Final

from corral.provider import CommandRequest, OperationError, Shell

from ._errors import ServiceError

__all__ = ["MODE_MASK", "apply_modes", "make_links", "read_links"]

log = logging.getLogger("corral.server.versions")

MODE_MASK: Final = 0o777
_ENV_BUDGET: Final = 32 * 1024
_MAX_BATCH: Final = 200


def _relative(path: str) -> str:
    """``/a/b`` as the command sees it from the workspace root (``./a/b``: never an option)."""
    return "./" + path.lstrip("/")


def _batches(items: Sequence[tuple[str, ...]]) -> Iterator[Sequence[tuple[str, ...]]]:
    start, size = 0, 0
    for i, item in enumerate(items):
        cost = sum(len(v.encode()) + 8 for v in item)
        if i > start and (size + cost > _ENV_BUDGET or i - start >= _MAX_BATCH):
            yield items[start:i]
            start, size = i, 0
        size += cost
    if start < len(items):
        yield items[start:]


async def _run(shell: Shell, command: str, env: dict[str, str]) -> str:
    request = CommandRequest(
        command=command,
        env=env,
        timeout_s=120.0,
        max_output_bytes=4 << 20,
        allow_shell_syntax=True,
    )
    try:
        result = await shell.run(request)
    except OperationError:
        raise ServiceError("the box refused a version command", code="failed") from None
    if result.exit_code != 0 or result.stdout_truncated:
        raise ServiceError("a version command failed in the box", code="failed")
    return result.stdout


async def read_links(shell: Shell, paths: Sequence[str]) -> dict[str, str]:
    """The target of each symlink in ``paths`` (agent paths), read in the box.

    A link that vanished (or changed type) since it was listed -- a process
    in the box is still working -- is left out of the result.

    Raises:
        ServiceError: ``failed`` when the box cannot run the query.
    """
    out: dict[str, str] = {}
    for batch in _batches([(p,) for p in paths]):
        # A random delimiter per batch: no target can be made to forge one.
        mark = secrets.token_hex(16)
        env = {f"P{i}": _relative(p) for i, (p,) in enumerate(batch)}
        env["D"] = mark
        lines = [f'readlink -- "$P{i}"; printf %s "$D"' for i in range(len(batch))]
        parts = (await _run(shell, "; ".join(lines), env)).split(mark)
        if len(parts) != len(batch) + 1 or parts[-1] != "":
            raise ServiceError("the box answered a link query unreadably", code="failed")
        for (p,), answer in zip(batch, parts, strict=False):
            target = answer[:-1]
            if not answer.endswith("\n") or not target or len(target) > 4096:
                log.warning("a symlink changed while a version was taken; left out")
                continue
            out[p] = target
    return out


async def _each(shell: Shell, lines: list[str], env: dict[str, str], what: str) -> None:
    """Run one line per item, each on its own: a refusal (a protected path) is logged, not fatal."""
    script = "; ".join(f"{{ {line}; }} || printf '%s\\n' {i}" for i, line in enumerate(lines))
    failed = (await _run(shell, script, env)).split()
    if failed:
        log.warning("%d %s could not be restored in the box", len(failed), what)


async def make_links(shell: Shell, links: Sequence[tuple[str, str]]) -> None:
    """Create each ``(path, target)`` symlink in the box (parents exist, paths are free)."""
    for batch in _batches(links):
        env: dict[str, str] = {}
        lines = []
        for i, (path, target) in enumerate(batch):
            env[f"P{i}"], env[f"T{i}"] = _relative(path), target
            lines.append(f'ln -s -- "$T{i}" "$P{i}"')
        await _each(shell, lines, env, "symlinks")


async def apply_modes(shell: Shell, modes: Sequence[tuple[str, int]]) -> None:
    """``chmod`` each ``(path, mode)`` in order (files and directories only; masked).

    A path the box refuses to change (a protected path of local-sandbox,
    say) keeps the mode the box gave it; that is logged.
    """
    for batch in _batches([(p, format(m & MODE_MASK, "04o")) for p, m in modes]):
        env: dict[str, str] = {}
        lines = []
        for i, (path, mode) in enumerate(batch):
            env[f"P{i}"] = _relative(path)
            # The mode is our own octal digits, checked here, never client text.
            if not mode.isdigit() or len(mode) != 4:
                raise ServiceError("a stored mode is malformed", code="failed")
            lines.append(f'chmod {mode} "$P{i}" 2>/dev/null')
        await _each(shell, lines, env, "modes")
