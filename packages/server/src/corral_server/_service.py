"""The durable-workspace service: what every HTTP route calls, free of HTTP.

Every method takes the caller's project and looks the workspace up *within
it*: a workspace of another project is ``not_found``, exactly like one that
does not exist, so ids cannot be probed across projects.

Materializations: a live box is opened through the workspace's pinned
provider, seeded from its current version, and recorded on a lease row
(holder, expiry, the box's ref). The lease is renewed while this process
lives; after a restart the same holder id finds its row and *resolves* the
recorded ref instead of opening a second box, and another replica may take
the lease over only once it expired. ``stop`` takes a version (acknowledged
once its row is committed), records each handle's final state, closes the
box and drops the lease.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final, Protocol

import anyio
import anyio.abc
import anyio.to_thread
import attrs

from corral import WorkspaceError, ref_from_json, ref_to_json
from corral.provider import (
    OperationError,
    ProcessInfo,
    ProcessManager,
    ProcessRequest,
    ProviderConfig,
    SessionRef,
    StreamChunk,
    TerminalSize,
    Workspace,
    WorkspaceProvider,
)

from ._blobs import BlobStore
from ._errors import ServiceError
from ._gc import DEFAULT_GRACE_S, DEFAULT_SKEW_S, GcReport, collect_garbage
from ._livefs import fs_call
from ._model import (
    HandleRecord,
    SandboxDefinition,
    VersionRecord,
    WorkspaceRecord,
    check_id,
    check_int,
    check_metadata,
    check_name,
    check_tags,
    new_id,
)
from ._reclaim import reclaim_session
from ._store import SqlStore
from ._versions import EMPTY_MANIFEST, VersionReader, capture, encode, restore

__all__ = ["ProviderFactory", "WorkspaceService", "hash_token"]

log = logging.getLogger("corral.server")


class ProviderFactory(Protocol):
    """Builds (or returns a cached) provider for a sandbox definition.

    The service calls it at create (to validate) and at each materialization;
    it raises ``ConfigError`` (or ``ServiceError``) for a definition it refuses.
    """

    def __call__(self, sandbox: SandboxDefinition, /) -> WorkspaceProvider:
        """The provider for ``sandbox``."""
        ...


MAX_READ_BYTES: Final = 16 << 20
_TOKEN_CACHE: Final = 1024


def hash_token(token: str) -> str:
    """The stored form of a bearer token: SHA-256 hex (tokens carry 256 random bits)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def info_json(info: ProcessInfo) -> dict[str, Any]:
    """A process info as the API returns it (without the process module's own id)."""
    out = attrs.asdict(info)
    out.pop("process_id", None)
    return out


def plugin_providers(
    operator_options: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    kinds: frozenset[str] | None = None,
) -> ProviderFactory:
    """Providers built by the installed plugins, one instance per (kind, factory options).

    Args:
        operator_options: Factory options per provider kind, set by whoever
            runs the service (merged under a definition's own, which the
            service accepts only when told to trust its clients with them).
        kinds: The provider kinds clients may name (None: every installed one).
    """
    import corral

    plugins = corral.default_plugins()
    cache: dict[str, WorkspaceProvider] = {}
    base = {k: dict(v) for k, v in (operator_options or {}).items()}

    def build(sandbox: SandboxDefinition) -> WorkspaceProvider:
        if sandbox.provider not in plugins.providers or (
            kinds is not None and sandbox.provider not in kinds
        ):
            raise ServiceError("sandbox.provider is not a provider this service offers")
        options = {**base.get(sandbox.provider, {}), **dict(sandbox.provider_options)}
        key = json.dumps([sandbox.provider, options], sort_keys=True, default=str)
        hit = cache.get(key)
        if hit is None:
            hit = plugins.provider(sandbox.provider).create(options)
            cache[key] = hit
        return hit

    return build


@attrs.define
class _Live:
    workspace: Workspace
    provider: WorkspaceProvider


@attrs.define
class _Capture:
    """An in-flight blob writer's registration (see :mod:`corral_server._gc`)."""

    id: str
    ended: bool = False


class WorkspaceService:
    """Workspaces, versions, materializations and handles over a store and a blob store.

    Args:
        store: Where records live (SQLite or PostgreSQL).
        blobs: Where version content lives.
        providers: Builds the provider of a sandbox definition.
        holder: This process's lease-holder id; keep it stable across restarts
            of the same replica (then its leases are resumed at once) and
            distinct between replicas.
        lease_ttl_s: A lease not renewed for this long may be taken over.
        idle_stop_s: A live box unused for this long is stopped (None: never).
        validate_open: At create, open and close a throw-away box so the
            provider's own checks judge the definition's options.
        client_provider_options: Accept ``provider_options`` (the provider
            factory's options: host paths, engines...) from clients. Only for
            a service whose clients are as trusted as its operator.
        gc_interval_s: Run the blob collector this often (None: never; see
            :mod:`corral_server._gc`).
        gc_grace_s: The collector's grace period. Versions are not bound by
            it: every blob writer registers a capture row that keeps its
            blobs from the collector (renewed with the leases, ending at its
            commit; see :mod:`corral_server._gc`).
        gc_skew_s: The collector's margin for clock differences between
            replicas and the blob store, around captures.
    """

    def __init__(
        self,
        store: SqlStore,
        blobs: BlobStore,
        *,
        providers: ProviderFactory | None = None,
        holder: str | None = None,
        lease_ttl_s: float = 30.0,
        idle_stop_s: float | None = 600.0,
        validate_open: bool = True,
        client_provider_options: bool = False,
        gc_interval_s: float | None = None,
        gc_grace_s: float = DEFAULT_GRACE_S,
        gc_skew_s: float = DEFAULT_SKEW_S,
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.reader = VersionReader(blobs)
        self._providers = providers or plugin_providers()
        self.holder = holder or f"srv-{secrets.token_hex(8)}"
        self.lease_ttl_s = lease_ttl_s
        self.idle_stop_s = idle_stop_s
        self.validate_open = validate_open
        self.client_provider_options = client_provider_options
        self.gc_interval_s = gc_interval_s
        self.gc_grace_s = gc_grace_s
        self.gc_skew_s = gc_skew_s
        self._live: dict[str, _Live] = {}
        self._used: dict[str, float] = {}
        """Monotonic time each live box was last used (idle auto-stop)."""
        self._locks: dict[str, anyio.Lock] = {}
        self._tokens: dict[str, str] = {}
        self._capture_holder = f"{self.holder}#{secrets.token_hex(6)}"
        """This process's captures: unlike leases, never resumed by a restart
        (a capture dies with its process), so the id is fresh per process."""

    # -- lifecycle of the service -------------------------------------------------

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Migrate the schema and start the lease renewer and the idle reaper in ``tg``."""
        await self.store.migrate()
        tg.start_soon(self._renew_loop)
        if self.idle_stop_s is not None:
            tg.start_soon(self._idle_loop)
        if self.gc_interval_s is not None:
            tg.start_soon(self._gc_loop, self.gc_interval_s)

    async def _gc_loop(self, interval_s: float) -> None:
        while True:
            await anyio.sleep(interval_s)
            try:
                await self.collect_garbage()
            except Exception:
                log.exception("blob collection failed")

    async def collect_garbage(
        self, *, now: float | None = None, skew_s: float | None = None
    ) -> GcReport:
        """Remove blobs nothing references or protects (see :mod:`corral_server._gc`).

        Args:
            now: The collection's start (tests move it; default: the clock).
            skew_s: The clock-skew margin (default: the service's ``gc_skew_s``).
        """
        return await collect_garbage(
            self.store,
            self.blobs,
            grace_s=self.gc_grace_s,
            now=now,
            reader=self.reader,
            skew_s=self.gc_skew_s if skew_s is None else skew_s,
        )

    async def _renew_loop(self) -> None:
        while True:
            await anyio.sleep(self.lease_ttl_s / 3)
            try:
                await self.renew()
            except Exception:
                log.exception("renewing leases failed")

    async def renew(self) -> None:
        """Extend this holder's leases; forget live boxes whose lease another holder took."""
        await self.store.renew_leases(self.holder, self.lease_ttl_s)
        await self.store.renew_captures(self._capture_holder, self.lease_ttl_s)
        held = {lease.workspace_id for lease in await self.store.leases_of(self.holder)}
        for ws_id in list(self._live):
            if ws_id not in held:
                self._forget(ws_id)

    def _forget(self, ws_id: str) -> None:
        # Not closed: the holder that took the lease over resumed this very box.
        log.warning("workspace %s: its lease passed to another holder; letting go", ws_id)
        self._live.pop(ws_id, None)
        self._used.pop(ws_id, None)

    async def _idle_loop(self) -> None:
        assert self.idle_stop_s is not None
        period = max(0.05, min(5.0, self.idle_stop_s / 4))
        while True:
            await anyio.sleep(period)
            try:
                await self.stop_idle()
            except Exception:
                log.exception("idle auto-stop failed")

    async def stop_idle(self) -> list[str]:
        """Stop every live box of this holder unused for ``idle_stop_s``; return their ids."""
        if self.idle_stop_s is None:
            return []
        stopped = []
        now = time.monotonic()
        for lease in await self.store.leases_of(self.holder):
            # Boxes leased before a restart count as idle from when they are noticed.
            self._used.setdefault(lease.workspace_id, now)
        for ws_id, used in list(self._used.items()):
            if now - used < self.idle_stop_s:
                continue
            if ws_id not in self._live:
                rec = await self.store.workspace_by_id(ws_id)
                if rec is None or await self.store.lease_holder(ws_id) != self.holder:
                    self._used.pop(ws_id, None)
                    continue
                await self._ensure_live(rec)
            await self._stop(ws_id)
            stopped.append(ws_id)
        return stopped

    async def aclose(self, *, stop_live: bool = False) -> None:
        """Forget live boxes (kept running and leased, so a restart resumes them) or stop them."""
        for ws_id in list(self._live):
            if stop_live:
                await self._stop(ws_id)
        self._live.clear()
        self._used.clear()

    @contextlib.asynccontextmanager
    async def _capturing(self) -> AsyncIterator[_Capture]:
        """Register a blob writer before its first ``put``; drop the row when done.

        The writer's commit ends the row in the same transaction (and sets
        ``ended``); on any other exit it is dropped here, or expires.
        """
        cap = _Capture(new_id("cap"))
        await self.store.begin_capture(cap.id, self._capture_holder, self.lease_ttl_s)
        try:
            yield cap
        finally:
            if not cap.ended:
                with anyio.CancelScope(shield=True):
                    try:
                        await self.store.end_capture(cap.id)
                    except Exception:
                        log.exception("dropping a capture's row failed (it expires)")

    # -- projects and tokens ------------------------------------------------------

    async def create_project(self, name: str) -> tuple[str, str]:
        """Add a project; return ``(project id, its first token)``."""
        check_name(name, "project name")
        project_id = new_id("prj")
        await self.store.create_project(project_id, name)
        return project_id, await self.add_token(project_id)

    async def add_token(self, project_id: str) -> str:
        """Issue another bearer token for a project (only its hash is stored)."""
        token = "crl_" + secrets.token_urlsafe(32)
        await self.store.add_token(project_id, hash_token(token))
        return token

    async def authenticate(self, token: str | None) -> str:
        """The project a bearer token belongs to.

        Raises:
            ServiceError: ``unauthenticated`` for a missing or unknown token.
        """
        if not token or len(token) > 256:
            raise ServiceError("a valid bearer token is required", code="unauthenticated")
        digest = hash_token(token)
        project = self._tokens.get(digest)
        if project is None:
            row = await self.store.token_project(digest)
            # The lookup is by an index on the hash; the compare that decides is constant-time.
            if row is None or not hmac.compare_digest(row[0], digest):
                raise ServiceError("a valid bearer token is required", code="unauthenticated")
            project = row[1]
            if len(self._tokens) >= _TOKEN_CACHE:
                self._tokens.clear()
            self._tokens[digest] = project
        return project

    # -- workspaces ---------------------------------------------------------------

    async def create(self, project: str, body: Mapping[str, Any]) -> WorkspaceRecord:
        """Create a workspace pinned to a validated sandbox definition."""
        unknown = set(body) - {"sandbox", "metadata", "tags"}
        if unknown:
            raise ServiceError("the request has an unknown field")
        sandbox = SandboxDefinition.from_json(body.get("sandbox"))
        if sandbox.provider_options and not self.client_provider_options:
            # Factory options are host configuration (directories, engines,
            # credentials): the operator's to set, not a client's.
            raise ServiceError(
                "sandbox.provider_options are set by the service's operator", code="forbidden"
            )
        metadata = check_metadata(body.get("metadata", {}))
        tags = check_tags(body.get("tags", []))
        await self._validate(sandbox)
        now = time.time()
        ws_id = new_id("ws")
        manifest = encode(EMPTY_MANIFEST)
        async with self._capturing() as cap:
            digest = await anyio.to_thread.run_sync(self.blobs.put, manifest)
            first = VersionRecord(new_id("ver"), ws_id, digest, now, 0, 0)
            rec = WorkspaceRecord(
                ws_id, project, sandbox, metadata, tags, "active", first.id, now, now
            )
            await self.store.insert_workspace(rec, first, capture_id=cap.id)
            cap.ended = True
        return rec

    async def _validate(self, sandbox: SandboxDefinition) -> None:
        try:
            provider = self._providers(sandbox)
        except ServiceError:
            raise
        except (WorkspaceError, ValueError, TypeError):
            raise ServiceError("sandbox.provider_options were refused by the provider") from None
        missing = set(sandbox.capabilities) - set(provider.capabilities)
        if missing:
            raise ServiceError("sandbox.capabilities names a capability the provider lacks")
        if not self.validate_open:
            return
        try:
            opened = await provider.open(
                ProviderConfig(sandbox.provider, sandbox.session_options()),
                SessionRef(session_id=new_id("check")),
                frozenset(sandbox.capabilities),
            )
        except WorkspaceError:
            raise ServiceError("the provider refused the sandbox definition") from None
        await opened.workspace.close()

    async def get(self, project: str, workspace_id: object) -> WorkspaceRecord:
        """A workspace of the project (``not_found`` otherwise)."""
        return await self.store.get_workspace(project, check_id(workspace_id, "ws", "workspace"))

    def is_live(self, workspace_id: str) -> bool:
        """Whether this process holds the workspace's live box."""
        return workspace_id in self._live

    async def update(
        self, project: str, workspace_id: object, body: Mapping[str, Any]
    ) -> WorkspaceRecord:
        """Replace metadata and/or tags."""
        unknown = set(body) - {"metadata", "tags"}
        if unknown:
            raise ServiceError("the request has an unknown field")
        rec = await self.get(project, workspace_id)
        metadata = check_metadata(body["metadata"]) if "metadata" in body else None
        tags = check_tags(body["tags"]) if "tags" in body else None
        return await self.store.update_workspace(project, rec.id, metadata=metadata, tags=tags)

    async def archive(self, project: str, workspace_id: object) -> WorkspaceRecord:
        """Stop the live box (taking a version) and mark the workspace archived."""
        rec = await self.get(project, workspace_id)
        await self.stop(project, rec.id)
        return await self.store.update_workspace(project, rec.id, state="archived")

    async def delete(self, project: str, workspace_id: object) -> None:
        """Close the live box without a version and remove every record of the workspace.

        Blobs stay: they are shared by content with other versions; the
        collector (:meth:`collect_garbage`) removes those nothing references.
        """
        rec = await self.get(project, workspace_id)
        async with self._lock(rec.id):
            live = self._live.pop(rec.id, None)
            self._used.pop(rec.id, None)
            if live is not None:
                await live.workspace.close()
            await self.store.delete_workspace(project, rec.id)

    # -- versions and files -------------------------------------------------------

    async def _version(
        self, project: str, workspace_id: object, source: object, version_id: object
    ) -> VersionRecord:
        ws_id = check_id(workspace_id, "ws", "workspace")
        if source in (None, "current"):
            if version_id is not None:
                raise ServiceError("version_id is only allowed with source=version")
            return await self.store.version_of(project, ws_id, None)
        if source == "version":
            vid = check_id(version_id, "ver", "version_id")
            return await self.store.version_of(project, ws_id, vid)
        if source == "live":
            raise ServiceError("source=live is not implemented", code="invalid_argument")
        raise ServiceError("source must be current or version")

    async def read_file(
        self,
        project: str,
        workspace_id: object,
        path: object,
        *,
        source: object = None,
        version_id: object = None,
        max_bytes: int = MAX_READ_BYTES,
    ) -> bytes:
        """A file of a ready version (no provider is opened)."""
        v = await self._version(project, workspace_id, source, version_id)
        return await anyio.to_thread.run_sync(self.reader.read_sync, v.manifest, path, max_bytes)

    async def ls(
        self,
        project: str,
        workspace_id: object,
        path: object,
        *,
        source: object = None,
        version_id: object = None,
    ) -> list[dict[str, Any]]:
        """A directory of a ready version."""
        v = await self._version(project, workspace_id, source, version_id)
        entries = await anyio.to_thread.run_sync(self.reader.ls_sync, v.manifest, path)
        return [attrs.asdict(e) for e in entries]

    async def stat(
        self,
        project: str,
        workspace_id: object,
        path: object,
        *,
        source: object = None,
        version_id: object = None,
    ) -> dict[str, Any]:
        """A path's metadata in a ready version."""
        v = await self._version(project, workspace_id, source, version_id)
        st = await anyio.to_thread.run_sync(self.reader.stat_sync, v.manifest, path, v.created_at)
        return attrs.asdict(st)

    async def versions(self, project: str, workspace_id: object) -> list[VersionRecord]:
        """Every version of a workspace, oldest first."""
        rec = await self.get(project, workspace_id)
        return await self.store.list_versions(rec.id)

    async def prune_versions(self, project: str, workspace_id: object, keep: object) -> list[str]:
        """Delete all but the ``keep`` newest versions (the current one always stays).

        Returns the removed version ids; the collector frees their blobs.
        """
        count = check_int(keep, "keep", lo=1, hi=100_000)
        rec = await self.get(project, workspace_id)
        return await self.store.prune_versions(rec.id, count)

    async def take_version(self, project: str, workspace_id: object) -> VersionRecord:
        """Take a version of the live box now (``conflict`` when it is not live)."""
        rec = await self.get(project, workspace_id)
        async with self._lock(rec.id):
            live = self._live.get(rec.id)
            if live is None:
                raise ServiceError("the workspace is not live", code="conflict")
            return await self._take_version(rec.id, live)

    async def _take_version(self, ws_id: str, live: _Live) -> VersionRecord:
        fs = live.workspace.fs
        if fs is None:
            raise ServiceError("the workspace has no fs module", code="failed")
        async with self._capturing() as cap:
            try:
                manifest, files, total = await capture(fs, self.blobs, live.workspace.shell)
            except OperationError:
                raise ServiceError("taking a version failed", code="failed") from None
            digest = await anyio.to_thread.run_sync(self.blobs.put, manifest)
            v = VersionRecord(new_id("ver"), ws_id, digest, time.time(), files, total)
            await self.store.add_version(v, capture_id=cap.id)
            cap.ended = True
        return v

    # -- materializations ---------------------------------------------------------

    def _lock(self, ws_id: str) -> anyio.Lock:
        lock = self._locks.get(ws_id)
        if lock is None:
            lock = self._locks[ws_id] = anyio.Lock()
        return lock

    async def connect(self, project: str, workspace_id: object) -> dict[str, Any]:
        """The live box of a workspace, materialised when needed: its description."""
        rec = await self.get(project, workspace_id)
        live = await self._ensure_live(rec)
        return {
            "workspace_id": rec.id,
            "live": True,
            "holder": self.holder,
            "provider": live.provider.provider_id,
        }

    async def materialize(self, project: str, workspace_id: object) -> dict[str, Any]:
        """Prepare the live box (same as :meth:`connect`: at most one exists)."""
        return await self.connect(project, workspace_id)

    async def _ensure_live(self, rec: WorkspaceRecord) -> _Live:
        if rec.state != "active":
            raise ServiceError("the workspace is archived", code="conflict")
        live = self._live.get(rec.id)
        if live is not None:
            # Still ours? A lease that expired (this process stalled past its
            # TTL) may have been taken over: the other holder now owns the box.
            if await self.store.lease_holder(rec.id) == self.holder:
                self._used[rec.id] = time.monotonic()
                return live
            self._forget(rec.id)
        async with self._lock(rec.id):
            live = self._live.get(rec.id)
            if live is not None:
                return live
            lease = await self.store.acquire_lease(rec.id, self.holder, self.lease_ttl_s)
            if lease.holder != self.holder:
                raise ServiceError(
                    "the workspace is live on another replica; retry there or after it stops",
                    code="busy",
                )
            provider = self._providers(rec.sandbox)
            workspace: Workspace | None = None
            if lease.ref is not None:
                workspace = await self._resume(rec, provider, lease.ref)
            if workspace is None:
                workspace = await self._open(rec, provider)
            live = _Live(workspace, provider)
            self._live[rec.id] = live
            self._used[rec.id] = time.monotonic()
            return live

    async def _record_ref(self, ws_id: str, ref: str, *, ready: bool) -> None:
        text = json.dumps({"ref": ref, "ready": ready})
        if not await self.store.set_lease_ref(ws_id, self.holder, text):
            raise ServiceError("the workspace's lease was lost", code="busy")

    async def _resume(
        self, rec: WorkspaceRecord, provider: WorkspaceProvider, lease_ref: str
    ) -> Workspace | None:
        try:
            recorded = json.loads(lease_ref)
            opening = recorded.get("opening")
            if isinstance(opening, str):
                # A holder died between ``provider.open`` and recording the
                # ref: remove whatever it may have created (see _reclaim).
                await reclaim_session(provider, opening)
                return None
            workspace = await provider.resolve(ref_from_json(recorded["ref"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("workspace %s: its lease holds an unreadable ref", rec.id)
            return None
        except WorkspaceError:
            log.warning(
                "workspace %s: its live box could not be resumed; opening a new one", rec.id
            )
            return None
        if recorded.get("ready") is not True:
            log.warning("workspace %s: discarding a box a crash left half restored", rec.id)
            with anyio.CancelScope(shield=True):
                await workspace.close()
            return None
        return workspace

    async def _open(self, rec: WorkspaceRecord, provider: WorkspaceProvider) -> Workspace:
        sandbox = rec.sandbox
        # The intent first: a crash inside ``open`` or before its ref is
        # recorded leaves this, and the next lease holder reclaims the box.
        text = json.dumps({"opening": rec.id})
        if not await self.store.set_lease_ref(rec.id, self.holder, text):
            raise ServiceError("the workspace's lease was lost", code="busy")
        try:
            opened = await provider.open(
                ProviderConfig(sandbox.provider, sandbox.session_options()),
                SessionRef(session_id=rec.id),
                frozenset(sandbox.capabilities),
            )
        except WorkspaceError:
            await self.store.release_lease(rec.id, self.holder)
            raise ServiceError("the provider could not open the workspace", code="failed") from None
        ref = ref_to_json(opened.ref)
        try:
            # The ref is recorded before the restore (a crash then leaves no
            # unknown box behind) but marked not ready: a box found half
            # restored is discarded, never used (it would lose files at stop).
            await self._record_ref(rec.id, ref, ready=False)
            current = await self.store.get_version(rec.id, rec.current_version_id or "")
            manifest = await anyio.to_thread.run_sync(self.reader.manifest_sync, current.manifest)
            if opened.workspace.fs is not None:
                await restore(opened.workspace.fs, self.blobs, manifest, opened.workspace.shell)
            await self._record_ref(rec.id, ref, ready=True)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await opened.workspace.close()
                await self.store.release_lease(rec.id, self.holder)
            raise
        return opened.workspace

    async def stop(self, project: str, workspace_id: object) -> dict[str, Any]:
        """Take a version of the live box, then close it; a no-op when it is not live."""
        rec = await self.get(project, workspace_id)
        if rec.id not in self._live:
            holder = await self.store.lease_holder(rec.id)
            if holder is None:
                return {"workspace_id": rec.id, "live": False, "version_id": None}
            if holder != self.holder:
                raise ServiceError(
                    "the workspace is live on another replica; stop it there", code="busy"
                )
            await self._ensure_live(rec)  # ours from before a restart: resume, then stop
        version = await self._stop(rec.id)
        return {
            "workspace_id": rec.id,
            "live": False,
            "version_id": None if version is None else version.id,
        }

    async def _stop(self, ws_id: str) -> VersionRecord | None:
        async with self._lock(ws_id):
            live = self._live.get(ws_id)
            if live is None:
                return None
            version = await self._take_version(ws_id, live)
            await self._record_handles(ws_id, live, final=True)
            del self._live[ws_id]
            self._used.pop(ws_id, None)
            with anyio.CancelScope(shield=True):
                await live.workspace.close()
                await self.store.release_lease(ws_id, self.holder)
            return version

    async def _record_handles(self, ws_id: str, live: _Live, *, final: bool) -> None:
        """Record each handle's last info; at a stop, kill it and archive its retained output.

        The archive (one blob per stream, with the cursor it starts at) keeps
        a stopped workspace's handles readable at the same cursors.
        """
        pm = live.workspace.module("process")
        if not isinstance(pm, ProcessManager):
            return
        for h in await self.store.list_handles(ws_id):
            if "archive" in h.info:
                continue
            if not final:
                try:
                    info = await pm.info(h.process_id)
                except OperationError:
                    continue
                await self.store.update_handle_info(h.id, info_json(info))
                continue
            async with self._capturing() as cap:  # the archive's blobs, until its row names them
                try:
                    info = await pm.kill(h.process_id)
                    out = info_json(info)
                    out["archive"] = {
                        name: await self._archive_stream(pm, h.process_id, name, info)
                        for name in ("stdout", "stderr")
                    }
                except OperationError:
                    continue
                await self.store.update_handle_info(h.id, out, capture_id=cap.id)

    async def _archive_stream(
        self, pm: ProcessManager, process_id: str, stream: str, info: ProcessInfo
    ) -> list[Any]:
        start = info.stdout_start if stream == "stdout" else info.stderr_start
        end = info.stdout_end if stream == "stdout" else info.stderr_end
        parts, cursor = [], start
        while cursor < end:
            chunk = await pm.read(
                process_id,
                "stdout" if stream == "stdout" else "stderr",
                cursor=cursor,
                max_bytes=min(1 << 20, end - cursor),
            )
            if not chunk.data:
                break
            parts.append(chunk.data)
            cursor = chunk.next_cursor
        digest = await anyio.to_thread.run_sync(self.blobs.put, b"".join(parts))
        return [start, digest]

    async def _read_archive(
        self, h: HandleRecord, stream: str, cursor: int, max_bytes: int
    ) -> StreamChunk:
        archive = h.info.get("archive")
        if not isinstance(archive, dict) or stream not in archive:
            raise ServiceError(
                "the handle's output is gone with its stopped materialization", code="not_found"
            )
        start, digest = archive[stream]
        data = await anyio.to_thread.run_sync(self.blobs.get, digest)
        end = start + len(data)
        if cursor < start:
            raise ServiceError(
                "the cursor is older than the retained output",
                code="cursor_expired",
                extra={"earliest": start},
            )
        if cursor > end:
            raise ServiceError("the cursor is past the end of the stream")
        piece = data[cursor - start : cursor - start + max_bytes]
        nxt = cursor + len(piece)
        return StreamChunk(data=piece, cursor=cursor, next_cursor=nxt, ended=nxt == end)

    async def live_fs(
        self, project: str, workspace_id: object, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """One operation of the live box's ``fs`` module (materialised when needed).

        See :mod:`corral_server._livefs`; versions stay the way to read
        without a box.
        """
        rec = await self.get(project, workspace_id)
        live = await self._ensure_live(rec)
        fs = live.workspace.fs
        if fs is None:
            raise ServiceError("the workspace's provider has no fs module", code="unsupported")
        return await fs_call(fs, body)

    # -- handles ------------------------------------------------------------------

    def _process(self, live: _Live) -> ProcessManager:
        pm = live.workspace.module("process")
        if not isinstance(pm, ProcessManager):
            raise ServiceError("the workspace's provider has no process module", code="unsupported")
        return pm

    async def start_process(
        self, project: str, workspace_id: object, request: ProcessRequest, kind: str
    ) -> HandleRecord:
        """Start an exec or PTY handle on the (materialised) workspace."""
        rec = await self.get(project, workspace_id)
        live = await self._ensure_live(rec)
        pm = self._process(live)
        try:
            info = await pm.start(request)
        except OperationError as exc:
            raise _op_error(exc) from None
        h = HandleRecord(
            new_id("h"),
            rec.id,
            info.process_id,
            "pty" if kind == "pty" else "exec",
            request.command,
            info_json(info),
            time.time(),
        )
        await self.store.insert_handle(h)
        return h

    async def _handle(
        self, project: str, workspace_id: object, handle_id: object
    ) -> tuple[HandleRecord, ProcessManager | None]:
        rec, h, holder = await self.store.handle_view(
            project,
            check_id(workspace_id, "ws", "workspace"),
            check_id(handle_id, "h", "handle"),
        )
        if "archive" in h.info:
            return h, None  # ended with a stopped materialization: read from its archive
        # Not archived: its box is live here, or left leased by a restart of
        # this service (resumed), or lost (a fresh box says not_found: lost).
        live = self._live.get(rec.id)
        if live is not None and holder == self.holder:
            self._used[rec.id] = time.monotonic()
        else:
            live = await self._ensure_live(rec)
        return h, self._process(live)

    async def handles(self, project: str, workspace_id: object) -> list[HandleRecord]:
        """Every handle of a workspace (as last recorded)."""
        rec = await self.get(project, workspace_id)
        return await self.store.list_handles(rec.id)

    async def handle_info(
        self, project: str, workspace_id: object, handle_id: object
    ) -> HandleRecord:
        """A handle with its process's current info."""
        h, pm = await self._handle(project, workspace_id, handle_id)
        if pm is None:
            return h
        try:
            info = info_json(await pm.info(h.process_id))
        except OperationError:
            info = {**dict(h.info), "state": "lost", "reason": "the process record is gone"}
        if info != dict(h.info):
            await self.store.update_handle_info(h.id, info)
        return attrs.evolve(h, info=info)

    async def read(
        self,
        project: str,
        workspace_id: object,
        handle_id: object,
        *,
        stream: str,
        cursor: int,
        max_bytes: int,
        wait_s: float,
    ) -> StreamChunk:
        """Bytes of a handle's stream after a cursor."""
        h, pm = await self._handle(project, workspace_id, handle_id)
        if pm is None or "archive" in h.info:
            return await self._read_archive(h, stream, cursor, max_bytes)
        try:
            return await pm.read(
                h.process_id,
                "stderr" if stream == "stderr" else "stdout",
                cursor=cursor,
                max_bytes=max_bytes,
                wait_s=wait_s,
            )
        except OperationError as exc:
            raise _op_error(exc) from None

    async def control(
        self,
        project: str,
        workspace_id: object,
        handle_id: object,
        action: str,
        *,
        data: bytes = b"",
        close: bool = False,
        signal: int = 15,
        size: TerminalSize | None = None,
        timeout_s: float = 0.0,
    ) -> HandleRecord:
        """stdin / signal / resize / wait / kill on a handle; return its info after."""
        h, pm = await self._handle(project, workspace_id, handle_id)
        if pm is None:
            if action == "wait":
                return h
            raise ServiceError("the handle's process has ended", code="conflict")
        try:
            if action == "stdin":
                if data:
                    await pm.write_stdin(h.process_id, data)
                if close:
                    await pm.close_stdin(h.process_id)
            elif action == "signal":
                await pm.signal(h.process_id, signal)
            elif action == "resize":
                assert size is not None
                await pm.resize(h.process_id, size)
            elif action == "wait":
                await pm.wait(h.process_id, timeout_s=timeout_s)
            elif action == "kill":
                await pm.kill(h.process_id)
        except OperationError as exc:
            raise _op_error(exc) from None
        return await self.handle_info(project, workspace_id, h.id)


_SAFE_CODES: Final = {
    "invalid_argument": ("invalid_argument", "the process module refused an argument"),
    "invalid_path": ("invalid_argument", "the working directory is not a valid path"),
    "not_found": ("not_found", "no such process or path"),
    "closed": ("conflict", "the process's input is closed or the process ended"),
    "busy": ("busy", "the process is busy"),
    "cursor_expired": ("cursor_expired", "the cursor is older than the retained output"),
    "forbidden": ("forbidden", "the workspace policy refused the command"),
    "policy_denied": ("forbidden", "the workspace policy refused the command"),
    "permission_denied": ("forbidden", "the workspace policy refused the command"),
    "too_large": ("too_large", "a value is too large"),
}


def _op_error(exc: OperationError) -> ServiceError:
    """The service error of a process-module error: a fixed message per code.

    The module's own message may quote the command or path the client sent;
    the code says enough and echoes nothing.
    """
    code, message = _SAFE_CODES.get(str(exc.code), ("failed", "the process operation failed"))
    earliest = getattr(exc, "earliest", None)
    extra: dict[str, object] | None = {"earliest": earliest} if isinstance(earliest, int) else None
    return ServiceError(message, code=code, extra=extra)
