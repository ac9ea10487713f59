"""Garbage collection of corral containers: ``corral docker gc [--dry-run]``.

A container is garbage when its workspace was closed (the host directory or
the volume is gone) or when the process that owns it died on this host (a
crash; a later resolve starts a fresh container anyway). Containers owned by
live processes, or by processes on other hosts whose workspace still exists,
are kept.
"""

from __future__ import annotations

import argparse
import os

import anyio
import anyio.to_thread
import attrs

from corral.provider import CliCommand

from ._engine import ContainerInfo, DockerEngine, EngineError
from ._labels import LABEL_MANAGED, LABEL_ROOT, LABEL_WORKSPACE, owner_alive

__all__ = ["GcResult", "collect_garbage", "gc_command"]


@attrs.frozen
class GcResult:
    """What a gc pass found.

    Attributes:
        removed: ``(container name, reason)`` of containers removed (or that
            would be, in a dry run).
        kept: Names of containers still in use.
    """

    removed: tuple[tuple[str, str], ...]
    kept: tuple[str, ...]


async def _reason(engine: DockerEngine, info: ContainerInfo) -> str | None:
    labels = info.labels
    root = labels.get(LABEL_ROOT)
    if root and owner_alive(labels) is not None:
        exists = await anyio.to_thread.run_sync(os.path.isdir, root)
        if not exists:
            return "workspace closed"
    if not root and labels.get(LABEL_WORKSPACE):
        volume = f"corral-{labels[LABEL_WORKSPACE]}"
        if not await engine.volume_exists(volume):
            return "workspace closed"
    alive = owner_alive(labels)
    if alive is False:
        return "owner process died"
    return None


async def collect_garbage(engine: DockerEngine, *, dry_run: bool = False) -> GcResult:
    """Remove containers whose workspace is closed or whose owner died.

    Raises:
        EngineError: The engine could not be listed.
    """
    removed: list[tuple[str, str]] = []
    kept: list[str] = []
    for info in await engine.list_containers({LABEL_MANAGED: "1"}):
        reason = await _reason(engine, info)
        if reason is None:
            kept.append(info.name)
            continue
        if not dry_run:
            await engine.remove(info.id)
        removed.append((info.name, reason))
    return GcResult(removed=tuple(removed), kept=tuple(kept))


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["gc"], help="gc: remove orphaned corral containers")
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed")
    parser.add_argument("--base-url", default=None, help="Docker daemon address (default: env)")


def _run(args: argparse.Namespace) -> int:
    from ._sdk import SdkEngine

    engine = SdkEngine(args.base_url)

    async def main() -> GcResult:
        try:
            return await collect_garbage(engine, dry_run=args.dry_run)
        finally:
            await engine.aclose()

    try:
        result = anyio.run(main)
    except EngineError as exc:
        print(f"corral docker gc: {exc.message}")
        return 1
    verb = "would remove" if args.dry_run else "removed"
    for name, reason in result.removed:
        print(f"{verb} {name} ({reason})")
    print(f"{len(result.removed)} {verb}, {len(result.kept)} in use")
    return 0


def gc_command() -> CliCommand:
    """The ``corral docker`` CLI command (``gc [--dry-run]``)."""
    return CliCommand(
        name="docker",
        help="manage corral's Docker containers (gc [--dry-run])",
        configure=_configure,
        run=_run,
    )
