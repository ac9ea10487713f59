"""The blob collector: remove blobs no version (and no handle archive) references any more.

Mark and sweep with **registered captures** and a grace period, not a lock.
Marking reads, in one store transaction, the start of the oldest live
*capture*, every version's manifest digest and every handle archive's
digest, then every file digest those manifests name. Sweeping removes each
other blob whose last written time is older than ``cutoff = min(start -
grace, oldest live capture start - skew)``.

Why captures: a version is taken over a long stretch -- one ``put`` per
file, possibly on another replica -- and only its final row makes its blobs
reachable. Holding a store lock over that would stall every replica's
versions behind each other. Instead every writer of blobs (a version
capture, a stop's handle archives, a new workspace's first manifest)
registers a row in the store *before* its first ``put`` (start time,
holder, an expiry its service renews like a lease) and ends it in the
transaction that commits what references the blobs. Every ``put`` refreshes
the blob's written time (also when the blob already existed), so every blob
of a capture live at the mark is younger than the cutoff and kept, however
long the capture takes; a capture registered after the mark writes only
after the collection started, hence after the cutoff. A capture not seen
live at the mark had committed its rows before the mark read them (the
captures are read first). A capture whose row expired (its service crashed
or stalled past the TTL) stops protecting and can no longer commit (its
commit checks the row, in the same transaction). ``skew`` is a margin for
the replicas' and the blob store's clocks: a capture counts as live until
``skew`` past its expiry, and protects from ``skew`` before its start.
The grace period still covers blobs written by anything that registered
nothing. A ``put`` racing the removal itself is settled by the blob store's
``collect`` (atomic with respect to ``put``; see :mod:`corral_server._blobs`).

Crash safety: the collector removes only blobs unreferenced at its mark, so
killing it at any point leaves every referenced blob in place (a blob the
local store had renamed aside for its last check is renamed back by the
next reader that misses it).
"""

from __future__ import annotations

import logging
import time
from typing import Final

import anyio.to_thread
import attrs

from ._blobs import BlobStore
from ._errors import ServiceError
from ._store import SqlStore
from ._versions import VersionReader

__all__ = ["DEFAULT_GRACE_S", "DEFAULT_SKEW_S", "GcReport", "collect_garbage"]

log = logging.getLogger("corral.server.gc")

DEFAULT_GRACE_S: Final = 3600.0
"""Blobs written less than an hour ago are never collected."""

DEFAULT_SKEW_S: Final = 60.0
"""How far the clocks of replicas and the blob store may disagree (see the module docstring)."""


@attrs.frozen
class GcReport:
    """What one collection did.

    Attributes:
        referenced: Distinct blobs the store references.
        seen: Blobs found in the blob store.
        recent: Unreferenced blobs kept because they are younger than the grace period.
        removed: Blobs removed.
    """

    referenced: int
    seen: int
    recent: int
    removed: int


async def collect_garbage(
    store: SqlStore,
    blobs: BlobStore,
    *,
    grace_s: float = DEFAULT_GRACE_S,
    now: float | None = None,
    reader: VersionReader | None = None,
    skew_s: float = DEFAULT_SKEW_S,
) -> GcReport:
    """Remove unreferenced blobs written before ``now - grace_s`` and before every live capture.

    Args:
        store: Where versions, handles and captures are recorded.
        blobs: The blob store to sweep.
        grace_s: Blobs written (or re-put) more recently are kept.
        now: The collection's start time (tests move it; default: the clock).
            Captures expire by the real clock.
        reader: A manifest reader to reuse (its cache); a new one by default.
        skew_s: The clock-skew margin around captures (see the module docstring).

    Raises:
        ServiceError: ``failed`` when a referenced manifest cannot be read:
            nothing is removed then (its files could not be marked).
    """
    if grace_s < 0 or skew_s < 0:
        raise ServiceError("the grace period and the clock-skew margin must not be negative")
    cutoff = (time.time() if now is None else now) - grace_s
    reader = reader or VersionReader(blobs)
    manifests, archives, oldest = await store.blob_roots(skew_s=skew_s)
    if oldest is not None:
        cutoff = min(cutoff, oldest - skew_s)

    def mark() -> set[str]:
        live = set(manifests) | archives
        for digest in manifests:
            try:
                manifest = reader.manifest_sync(digest)
            except (ServiceError, ValueError, KeyError, TypeError):
                log.exception("a version's manifest is unreadable; collecting nothing")
                raise ServiceError(
                    "a version's manifest is unreadable; no blob was collected", code="failed"
                ) from None
            live.update(e[3] for e in manifest.values() if e[0] == "file")
        return live

    live = await anyio.to_thread.run_sync(mark)

    def sweep() -> tuple[int, int, int]:
        seen = recent = removed = 0
        for digest, written in blobs.list():
            seen += 1
            if digest in live:
                continue
            if written >= cutoff:
                recent += 1
            elif blobs.collect(digest, cutoff):
                removed += 1
        return seen, recent, removed

    seen, recent, removed = await anyio.to_thread.run_sync(sweep)
    # Rows no collection counts as live any more (their writers cannot commit).
    await store.drop_expired_captures(time.time() - skew_s)
    report = GcReport(referenced=len(live), seen=seen, recent=recent, removed=removed)
    log.info("blob collection: %s", report)
    return report
