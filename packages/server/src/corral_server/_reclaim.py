"""Reclaiming a box a crash left between ``provider.open`` and recording its ref.

The provider contract names a box only by the ref ``open`` returns, and a
ref is not predictable from the session id (providers add randomness). So
the service records its *intent* first -- the lease row says "opening, for
session S" -- and a SIGKILL between ``open`` and recording the ref leaves
that intent behind. Whoever next takes the lease (the same replica after a
restart, or another once the lease expired) finds it and asks the provider
to remove whatever it created for that session, before opening a new box.
The lease is exclusive, so nothing else is opening a box for that session
meanwhile.

Only a provider knows how it names what it creates, so the search is the
provider's: the optional ``corral.provider.SessionReclaimer`` hook (the
posix-core tmpdir providers and docker implement it). Any other provider is
told nothing can be searched (logged with the session id, so an operator
can look); the in-memory provider keeps nothing past its process anyway.
"""

from __future__ import annotations

import logging

from corral.provider import SessionReclaimer, WorkspaceProvider

__all__ = ["reclaim_session"]

log = logging.getLogger("corral.server")


async def reclaim_session(provider: WorkspaceProvider, session_id: str) -> int:
    """Remove every box ``provider`` may have created for ``session_id``; return how many.

    Best effort by design: a failure is logged (the box stays where the
    provider's own garbage collection finds it, e.g. ``corral docker gc``),
    never raised, so the workspace still materialises.
    """
    if not isinstance(provider, SessionReclaimer):
        log.warning(
            "provider %s cannot be searched for a box a crashed open may have left (session %s)",
            provider.provider_id,
            session_id,
        )
        return 0
    try:
        removed = await provider.reclaim_session(session_id)
    except Exception:
        log.exception("reclaiming a box a crashed open left failed")
        return 0
    if removed:
        log.warning("removed %d boxes a crashed open left (session %s)", removed, session_id)
    return removed
