"""Reclaiming a box a crash left between ``provider.open`` and recording its ref.

The provider contract names a box only by the ref ``open`` returns, and a
ref is not predictable from the session id (providers add randomness). So
the service records its *intent* first -- the lease row says "opening, for
session S" -- and a SIGKILL between ``open`` and recording the ref leaves
that intent behind. Whoever next takes the lease (the same replica after a
restart, or another once the lease expired) finds it and removes whatever
that session id could have created, before opening a new box. The lease is
exclusive, so nothing else is opening a box for that session meanwhile.

What a session id could have created is provider-specific, so this is the
one place that knows providers' naming:

* providers on a posix-core tmpdir layout (local-bash, local-sandbox,
  docker in local mode) name the workspace directory
  ``ws-<sanitized session id>-<random>`` under the layout's base: every such
  directory is removed with the layout's own ``remove_workspace``;
* docker labels each container with its workspace directory's name: those
  containers are removed through the provider's engine first.

Any other provider is told nothing can be searched (logged with the session
id, so an operator can look); the in-memory provider keeps nothing past its
process anyway.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import anyio.to_thread

from corral.provider import WorkspaceProvider

__all__ = ["reclaim_session"]

log = logging.getLogger("corral.server")


async def reclaim_session(provider: WorkspaceProvider, session_id: str) -> int:
    """Remove every box ``provider`` may have created for ``session_id``; return how many.

    Best effort by design: a failure is logged (the box stays where the
    provider's own garbage collection finds it: ``corral docker gc``
    removes a container whose directory is gone), never raised, so the
    workspace still materialises.
    """
    try:
        from corral_posix import TmpdirLayout, sanitize_session_id
    except ImportError:  # no posix-core installed: no provider uses its layout
        TmpdirLayout = None  # type: ignore[assignment,misc]
    layout: Any = getattr(provider, "layout", None)
    if TmpdirLayout is None or not isinstance(layout, TmpdirLayout):
        log.warning(
            "provider %s cannot be searched for a box a crashed open may have left (session %s)",
            provider.provider_id,
            session_id,
        )
        return 0
    prefix = f"ws-{sanitize_session_id(session_id)}-"

    def find() -> list[str]:
        try:
            names = os.listdir(layout.base_dir)
        except FileNotFoundError:
            return []
        return [n for n in names if n.startswith(prefix) and layout.is_workspace_name(n)]

    removed = 0
    try:
        for name in await anyio.to_thread.run_sync(find):
            await _containers(provider, name)
            await anyio.to_thread.run_sync(layout.remove_workspace, name)
            removed += 1
    except Exception:
        log.exception("reclaiming a box a crashed open left failed")
    if removed:
        log.warning("removed %d boxes a crashed open left (session %s)", removed, session_id)
    return removed


async def _containers(provider: WorkspaceProvider, workspace: str) -> None:
    """docker: the containers labelled with the workspace directory's name."""
    engine: Any = getattr(provider, "engine", None)
    if provider.provider_id != "docker" or engine is None:
        return
    try:
        from corral_docker import LABEL_WORKSPACE
    except ImportError:
        return
    for box in await engine.list_containers({LABEL_WORKSPACE: workspace}):
        await engine.remove(box.id)
