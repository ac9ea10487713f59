"""The service's state: projects and tokens, workspaces, versions, leases and handles.

One SQL implementation, two engines:

* **SQLite** (the default; ``corral serve`` needs no setup): one file in WAL
  mode with ``synchronous=FULL``, so a write the API acknowledged survives a
  crash of the process or the machine; one connection, one writer.
* **PostgreSQL** (psycopg 3) for several service replicas sharing one state.
  psycopg's blocking API is used from worker threads, exactly as SQLite's
  is: asyncpg and psycopg's async API run on asyncio only, and the service
  runs on trio too.

Every call runs in a worker thread (``anyio.to_thread``), never on the event
loop. Each public method is one transaction. The schema is versioned
(:data:`MIGRATIONS`); a store brings its database up to date when opened,
under a lock, so replicas starting together migrate once.

Leases make "at most one live materialization per workspace" hold across
restarts and replicas: :meth:`SqlStore.acquire_lease` is a single atomic
upsert that takes the row only when it is free, expired, or already ours.
"""

from __future__ import annotations

import contextlib
import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol, TypeVar, cast

import anyio.to_thread
import attrs

from ._errors import ServiceError
from ._model import (
    HandleRecord,
    SandboxDefinition,
    VersionRecord,
    WorkspaceRecord,
    WorkspaceState,
    json_list,
)

__all__ = ["MIGRATIONS", "Lease", "SqlStore", "open_store"]

T = TypeVar("T")

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (
        "CREATE TABLE projects (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE,"
        " created_at {REAL} NOT NULL)",
        "CREATE TABLE tokens (hash TEXT PRIMARY KEY, project_id TEXT NOT NULL,"
        " created_at {REAL} NOT NULL)",
        "CREATE TABLE workspaces (id TEXT PRIMARY KEY, project_id TEXT NOT NULL,"
        " sandbox TEXT NOT NULL, metadata TEXT NOT NULL, tags TEXT NOT NULL,"
        " state TEXT NOT NULL, current_version_id TEXT, created_at {REAL} NOT NULL,"
        " updated_at {REAL} NOT NULL)",
        "CREATE INDEX workspaces_project ON workspaces (project_id, id)",
        "CREATE TABLE workspace_tags (workspace_id TEXT NOT NULL, tag TEXT NOT NULL,"
        " PRIMARY KEY (workspace_id, tag))",
        "CREATE INDEX workspace_tags_tag ON workspace_tags (tag, workspace_id)",
        "CREATE TABLE versions (id TEXT PRIMARY KEY, workspace_id TEXT NOT NULL,"
        " manifest TEXT NOT NULL, created_at {REAL} NOT NULL, files {BIGINT} NOT NULL,"
        " bytes {BIGINT} NOT NULL)",
        "CREATE INDEX versions_workspace ON versions (workspace_id, created_at)",
        "CREATE TABLE leases (workspace_id TEXT PRIMARY KEY, holder TEXT NOT NULL,"
        " expires_at {REAL} NOT NULL, ref TEXT, last_used {REAL} NOT NULL)",
        "CREATE TABLE handles (id TEXT PRIMARY KEY, workspace_id TEXT NOT NULL,"
        " process_id TEXT NOT NULL, kind TEXT NOT NULL, command TEXT NOT NULL,"
        " info TEXT NOT NULL, created_at {REAL} NOT NULL)",
        "CREATE INDEX handles_workspace ON handles (workspace_id, created_at)",
    ),
    (
        # In-flight blob writers (version captures, handle archives, a new
        # workspace's first manifest): the collector keeps every blob written
        # after the oldest live one started (see corral_server._gc).
        "CREATE TABLE captures (id TEXT PRIMARY KEY, holder TEXT NOT NULL,"
        " started_at {REAL} NOT NULL, expires_at {REAL} NOT NULL)",
        "CREATE INDEX captures_holder ON captures (holder)",
    ),
)
"""Schema migrations in order; entry ``i`` brings the schema from version ``i`` to ``i + 1``."""

_PG_MIGRATION_LOCK: Final = 0x636F7272616C  # "corral": one advisory lock id for migrations


@attrs.frozen
class Lease:
    """Who holds a workspace's materialization, until when, and the live box's ref.

    Attributes:
        workspace_id: The workspace.
        holder: The service process holding it.
        expires_at: Unix time after which another holder may take it over.
        ref: The live workspace's ref as JSON (None while being opened).
        last_used: Unix time the ref was last recorded (idle time is kept in memory
            by the holder, which serves every request to its boxes).
    """

    workspace_id: str
    holder: str
    expires_at: float
    ref: str | None
    last_used: float


class _Engine(Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def placeholder(self) -> str: ...

    @property
    def types(self) -> Mapping[str, str]: ...

    def connect(self) -> Any: ...

    def begin(self, conn: Any, write: bool) -> None: ...

    def lock_migrations(self, cur: Any) -> None: ...


class _SQLite:
    kind: Final = "sqlite"
    placeholder: Final = "?"
    types: Final = {"REAL": "REAL", "BIGINT": "INTEGER"}

    def __init__(self, path: str) -> None:
        self.path = path

    def connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=30.0
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def begin(self, conn: Any, write: bool) -> None:
        # IMMEDIATE for writers: take the write lock up front, so two
        # transactions never both read and then deadlock upgrading to write.
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")

    def lock_migrations(self, cur: Any) -> None:
        """BEGIN IMMEDIATE already serialises writers."""


class _Postgres:
    kind: Final = "postgresql"
    placeholder: Final = "%s"
    types: Final = {"REAL": "DOUBLE PRECISION", "BIGINT": "BIGINT"}

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def connect(self) -> Any:
        try:
            import psycopg
        except ImportError:
            raise ImportError(
                "a PostgreSQL store needs psycopg: pip install 'corral-server[postgres]'"
            ) from None
        return psycopg.connect(self.dsn, autocommit=True)

    def begin(self, conn: Any, write: bool) -> None:
        conn.execute("BEGIN" if write else "BEGIN READ ONLY")

    def lock_migrations(self, cur: Any) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_MIGRATION_LOCK,))


def open_store(url: str, *, connections: int = 4) -> SqlStore:
    """A store for ``url``: ``postgresql://...`` or a SQLite file path (``sqlite:///path`` too).

    Raises:
        ServiceError: An unsupported URL scheme.
    """
    if url.startswith(("postgresql://", "postgres://")):
        return SqlStore(_Postgres(url), connections=connections)
    if url.startswith("sqlite:///"):
        url = url.removeprefix("sqlite://")
    elif "://" in url:
        raise ServiceError("the store URL must be postgresql://... or a SQLite file path")
    return SqlStore(_SQLite(url), connections=1)


class SqlStore:
    """The service state in SQLite or PostgreSQL (see the module docstring).

    Args:
        engine: The database engine.
        connections: Connections kept open (SQLite: 1, its single writer).
    """

    def __init__(self, engine: _Engine, *, connections: int = 1) -> None:
        self._engine = engine
        self._size = max(1, connections)
        self._pool: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._all: list[Any] = []
        self._lock = threading.Lock()
        self._limiter = anyio.CapacityLimiter(self._size)

    @property
    def kind(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._engine.kind

    # -- plumbing ---------------------------------------------------------------

    def _sql(self, text: str) -> str:
        if self._engine.placeholder != "?":
            text = text.replace("?", self._engine.placeholder)
        return text

    def _checkout(self) -> Any:
        try:
            return self._pool.get_nowait()
        except queue.Empty:
            with self._lock:
                conn = self._engine.connect()
                self._all.append(conn)
            return conn

    def _discard(self, conn: Any) -> None:
        """Drop a connection that failed mid-transaction (the server restarted, say)."""
        with self._lock:
            if conn in self._all:
                self._all.remove(conn)
        with contextlib.suppress(Exception):
            conn.close()

    def _tx_sync(self, fn: Callable[[Any], T], write: bool = True) -> T:
        conn = self._checkout()
        try:
            self._engine.begin(conn, write)
            try:
                result = fn(conn.cursor())
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except ServiceError:
            self._pool.put(conn)  # the transaction was rolled back cleanly
            raise
        except BaseException:
            # The connection's state is unknown (a lost server, a failed
            # ROLLBACK): never reuse it; the next call opens a fresh one.
            self._discard(conn)
            raise
        self._pool.put(conn)
        return result

    async def _tx(self, fn: Callable[[Any], T], *, write: bool = True) -> T:
        return await anyio.to_thread.run_sync(self._tx_sync, fn, write, limiter=self._limiter)

    def _exec(self, cur: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        cur.execute(self._sql(sql), tuple(params))
        return cur

    async def migrate(self) -> int:
        """Bring the schema up to date; return its version."""

        def run(cur: Any) -> int:
            self._engine.lock_migrations(cur)
            self._exec(
                cur,
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY,"
                f" applied_at {self._engine.types['REAL']} NOT NULL)",
            )
            row = self._exec(cur, "SELECT MAX(version) FROM schema_migrations").fetchone()
            have = int(row[0] or 0)
            if have > len(MIGRATIONS):
                raise ServiceError(
                    f"the database schema (version {have}) is newer than this "
                    f"corral-server (version {len(MIGRATIONS)}); upgrade it",
                    code="failed",
                )
            for version in range(have, len(MIGRATIONS)):
                for stmt in MIGRATIONS[version]:
                    self._exec(cur, stmt.format(**self._engine.types))
                self._exec(
                    cur,
                    "INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)",
                    (version + 1, time.time()),
                )
            return len(MIGRATIONS)

        return await self._tx(run)

    async def aclose(self) -> None:
        """Close every connection."""

        def close() -> None:
            with self._lock:
                for conn in self._all:
                    conn.close()
                self._all.clear()

        await anyio.to_thread.run_sync(close)

    # -- projects and tokens ------------------------------------------------------

    async def create_project(self, project_id: str, name: str) -> None:
        """Add a project.

        Raises:
            ServiceError: ``conflict`` when the name is taken.
        """

        def run(cur: Any) -> None:
            if self._exec(cur, "SELECT 1 FROM projects WHERE name = ?", (name,)).fetchone():
                raise ServiceError("a project of that name exists", code="conflict")
            self._exec(
                cur,
                "INSERT INTO projects (id, name, created_at) VALUES (?, ?, ?)",
                (project_id, name, time.time()),
            )

        await self._tx(run)

    async def project_by_name(self, name: str) -> str | None:
        """The id of the project called ``name``."""

        def run(cur: Any) -> str | None:
            row = self._exec(cur, "SELECT id FROM projects WHERE name = ?", (name,)).fetchone()
            return None if row is None else str(row[0])

        return await self._tx(run, write=False)

    async def add_token(self, project_id: str, token_hash: str) -> None:
        """Record a token's hash for a project."""

        def run(cur: Any) -> None:
            self._exec(
                cur,
                "INSERT INTO tokens (hash, project_id, created_at) VALUES (?, ?, ?)",
                (token_hash, project_id, time.time()),
            )

        await self._tx(run)

    async def token_project(self, token_hash: str) -> tuple[str, str] | None:
        """``(stored hash, project id)`` of a token hash, or None."""

        def run(cur: Any) -> tuple[str, str] | None:
            row = self._exec(
                cur, "SELECT hash, project_id FROM tokens WHERE hash = ?", (token_hash,)
            ).fetchone()
            return None if row is None else (str(row[0]), str(row[1]))

        return await self._tx(run, write=False)

    # -- workspaces ---------------------------------------------------------------

    @staticmethod
    def _workspace(row: Sequence[Any]) -> WorkspaceRecord:
        sandbox = json.loads(row[2])
        return WorkspaceRecord(
            id=row[0],
            project=row[1],
            sandbox=SandboxDefinition(
                provider=sandbox["provider"],
                provider_options=sandbox["provider_options"],
                options=sandbox["options"],
                image=sandbox["image"],
                mount_path=sandbox["mount_path"],
                capabilities=tuple(sandbox["capabilities"]),
            ),
            metadata=json.loads(row[3]),
            tags=tuple(json.loads(row[4])),
            state=row[5],
            current_version_id=row[6],
            created_at=float(row[7]),
            updated_at=float(row[8]),
        )

    _WS_COLUMNS: Final = (
        "id, project_id, sandbox, metadata, tags, state, current_version_id, created_at, updated_at"
    )

    def _get_ws(self, cur: Any, project: str, workspace_id: str) -> WorkspaceRecord:
        row = self._exec(
            cur,
            f"SELECT {self._WS_COLUMNS} FROM workspaces WHERE id = ? AND project_id = ?",  # noqa: S608 - constant names; values are bound
            (workspace_id, project),
        ).fetchone()
        if row is None:
            raise ServiceError("no such workspace", code="not_found")
        return self._workspace(row)

    async def insert_workspace(
        self, rec: WorkspaceRecord, first: VersionRecord, *, capture_id: str | None = None
    ) -> None:
        """Add a workspace with its first (empty) version as the current one.

        Args:
            rec: The workspace.
            first: Its first version.
            capture_id: The capture that wrote the version's blobs: ended in
                the same transaction (``failed`` when it expired).
        """

        def run(cur: Any) -> None:
            if capture_id is not None:
                self._finish_capture(cur, capture_id)
            self._exec(
                cur,
                f"INSERT INTO workspaces ({self._WS_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608 - constant names; values are bound
                (
                    rec.id,
                    rec.project,
                    json.dumps(rec.sandbox.to_json(), separators=(",", ":")),
                    json.dumps(dict(rec.metadata), separators=(",", ":")),
                    json_list(rec.tags),
                    rec.state,
                    first.id,
                    rec.created_at,
                    rec.updated_at,
                ),
            )
            self._insert_version(cur, first)
            self._set_tags(cur, rec.id, rec.tags)

        await self._tx(run)

    def _set_tags(self, cur: Any, workspace_id: str, tags: Sequence[str]) -> None:
        self._exec(cur, "DELETE FROM workspace_tags WHERE workspace_id = ?", (workspace_id,))
        for tag in tags:
            self._exec(
                cur,
                "INSERT INTO workspace_tags (workspace_id, tag) VALUES (?, ?)",
                (workspace_id, tag),
            )

    async def workspace_by_id(self, workspace_id: str) -> WorkspaceRecord | None:
        """A workspace whatever its project (for the service's own housekeeping only)."""

        def run(cur: Any) -> WorkspaceRecord | None:
            row = self._exec(
                cur,
                f"SELECT {self._WS_COLUMNS} FROM workspaces WHERE id = ?",  # noqa: S608 - constant names; values are bound
                (workspace_id,),
            ).fetchone()
            return None if row is None else self._workspace(row)

        return await self._tx(run, write=False)

    async def get_workspace(self, project: str, workspace_id: str) -> WorkspaceRecord:
        """A workspace of the project.

        Raises:
            ServiceError: ``not_found`` (also when it belongs to another project).
        """
        return await self._tx(lambda cur: self._get_ws(cur, project, workspace_id), write=False)

    async def list_workspaces(
        self,
        project: str,
        *,
        tag: str | None = None,
        state: str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> list[WorkspaceRecord]:
        """Up to ``limit`` workspaces of a project in id order, after the id ``after``."""
        sql = f"SELECT {self._WS_COLUMNS} FROM workspaces WHERE project_id = ?"  # noqa: S608 - constant names; values are bound
        params: list[Any] = [project]
        if tag is not None:
            sql += " AND id IN (SELECT workspace_id FROM workspace_tags WHERE tag = ?)"
            params.append(tag)
        if state is not None:
            sql += " AND state = ?"
            params.append(state)
        if after is not None:
            sql += " AND id > ?"
            params.append(after)
        sql += " ORDER BY id LIMIT ?"
        params.append(limit)

        def run(cur: Any) -> list[WorkspaceRecord]:
            return [self._workspace(r) for r in self._exec(cur, sql, params).fetchall()]

        return await self._tx(run, write=False)

    async def update_workspace(
        self,
        project: str,
        workspace_id: str,
        *,
        metadata: dict[str, Any] | None = None,
        tags: tuple[str, ...] | None = None,
        state: str | None = None,
    ) -> WorkspaceRecord:
        """Replace metadata and/or tags, or change the state; return the new record."""

        def run(cur: Any) -> WorkspaceRecord:
            rec = self._get_ws(cur, project, workspace_id)
            new = attrs.evolve(
                rec,
                metadata=rec.metadata if metadata is None else metadata,
                tags=rec.tags if tags is None else tags,
                state=rec.state if state is None else cast(WorkspaceState, state),
                updated_at=time.time(),
            )
            self._exec(
                cur,
                "UPDATE workspaces SET metadata = ?, tags = ?, state = ?, updated_at = ?"
                " WHERE id = ?",
                (
                    json.dumps(dict(new.metadata), separators=(",", ":")),
                    json_list(new.tags),
                    new.state,
                    new.updated_at,
                    workspace_id,
                ),
            )
            if tags is not None:
                self._set_tags(cur, workspace_id, tags)
            return new

        return await self._tx(run)

    async def delete_workspace(self, project: str, workspace_id: str) -> list[str]:
        """Remove a workspace and everything it owns; return its versions' manifest digests."""

        def run(cur: Any) -> list[str]:
            self._get_ws(cur, project, workspace_id)
            manifests = [
                str(r[0])
                for r in self._exec(
                    cur, "SELECT manifest FROM versions WHERE workspace_id = ?", (workspace_id,)
                ).fetchall()
            ]
            for table in ("versions", "handles", "leases", "workspace_tags"):
                self._exec(cur, f"DELETE FROM {table} WHERE workspace_id = ?", (workspace_id,))  # noqa: S608 - constant names; values are bound
            self._exec(cur, "DELETE FROM workspaces WHERE id = ?", (workspace_id,))
            return manifests

        return await self._tx(run)

    # -- versions -----------------------------------------------------------------

    def _insert_version(self, cur: Any, v: VersionRecord) -> None:
        self._exec(
            cur,
            "INSERT INTO versions (id, workspace_id, manifest, created_at, files, bytes)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (v.id, v.workspace_id, v.manifest, v.created_at, v.files, v.bytes),
        )

    async def add_version(self, v: VersionRecord, *, capture_id: str | None = None) -> None:
        """Record a ready version and make it the workspace's current one (one transaction).

        Args:
            v: The version.
            capture_id: The capture that wrote its blobs: ended in the same
                transaction, and the version is refused (``failed``) when the
                capture expired (the collector may have taken its blobs).
        """

        def run(cur: Any) -> None:
            if capture_id is not None:
                self._finish_capture(cur, capture_id)
            self._insert_version(cur, v)
            self._exec(
                cur,
                "UPDATE workspaces SET current_version_id = ?, updated_at = ? WHERE id = ?",
                (v.id, time.time(), v.workspace_id),
            )

        await self._tx(run)

    async def get_version(self, workspace_id: str, version_id: str) -> VersionRecord:
        """A version of a workspace.

        Raises:
            ServiceError: ``not_found``.
        """

        def run(cur: Any) -> VersionRecord:
            row = self._exec(
                cur,
                "SELECT id, workspace_id, manifest, created_at, files, bytes FROM versions"
                " WHERE id = ? AND workspace_id = ?",
                (version_id, workspace_id),
            ).fetchone()
            if row is None:
                raise ServiceError("no such version", code="not_found")
            return VersionRecord(row[0], row[1], row[2], float(row[3]), int(row[4]), int(row[5]))

        return await self._tx(run, write=False)

    async def version_of(
        self, project: str, workspace_id: str, version_id: str | None
    ) -> VersionRecord:
        """A version (None: the current one) of a project's workspace, in one read.

        Raises:
            ServiceError: ``not_found`` for the workspace (of this project) or the version.
        """

        def run(cur: Any) -> VersionRecord:
            row = self._exec(
                cur,
                "SELECT v.id, v.workspace_id, v.manifest, v.created_at, v.files, v.bytes"
                " FROM workspaces w JOIN versions v ON v.workspace_id = w.id"
                " WHERE w.id = ? AND w.project_id = ? AND v.id = COALESCE(?, w.current_version_id)",
                (workspace_id, project, version_id),
            ).fetchone()
            if row is None:
                self._get_ws(cur, project, workspace_id)  # not_found for the workspace first
                raise ServiceError("no such version", code="not_found")
            return VersionRecord(row[0], row[1], row[2], float(row[3]), int(row[4]), int(row[5]))

        return await self._tx(run, write=False)

    async def list_versions(self, workspace_id: str) -> list[VersionRecord]:
        """Every version of a workspace, oldest first."""

        def run(cur: Any) -> list[VersionRecord]:
            rows = self._exec(
                cur,
                "SELECT id, workspace_id, manifest, created_at, files, bytes FROM versions"
                " WHERE workspace_id = ? ORDER BY created_at, id",
                (workspace_id,),
            ).fetchall()
            return [
                VersionRecord(r[0], r[1], r[2], float(r[3]), int(r[4]), int(r[5])) for r in rows
            ]

        return await self._tx(run, write=False)

    async def prune_versions(self, workspace_id: str, keep: int) -> list[str]:
        """Delete all but the ``keep`` newest versions (never the current one); their ids.

        Their blobs stay until the collector finds nothing references them.
        """

        def run(cur: Any) -> list[str]:
            current = self._exec(
                cur, "SELECT current_version_id FROM workspaces WHERE id = ?", (workspace_id,)
            ).fetchone()
            rows = self._exec(
                cur,
                "SELECT id FROM versions WHERE workspace_id = ? ORDER BY created_at DESC, id DESC",
                (workspace_id,),
            ).fetchall()
            kept = {str(r[0]) for r in rows[:keep]}
            if current is not None and current[0] is not None:
                kept.add(str(current[0]))
            gone = [str(r[0]) for r in rows if str(r[0]) not in kept]
            for version_id in gone:
                self._exec(cur, "DELETE FROM versions WHERE id = ?", (version_id,))
            return gone

        return await self._tx(run)

    async def blob_roots(self, *, skew_s: float = 0.0) -> tuple[set[str], set[str], float | None]:
        """What keeps blobs alive, read in one transaction (the collector's mark roots).

        The captures are read **first**: PostgreSQL's read-committed
        statements each see their own snapshot, and a capture ends only in
        (or after) the transaction that commits what references its blobs.
        So a capture not seen live here had committed its rows before the
        reads below, which then see them.

        Args:
            skew_s: A capture counts as live until this long after its
                expiry (the replicas' clocks may differ this much).

        Returns:
            The manifest digest of every version of every workspace, every
            digest a handle's archived output names, and the start of the
            oldest live capture (None when there is none).
        """

        def run(cur: Any) -> tuple[set[str], set[str], float | None]:
            row = self._exec(
                cur,
                "SELECT MIN(started_at) FROM captures WHERE expires_at >= ?",
                (time.time() - skew_s,),
            ).fetchone()
            oldest = None if row is None or row[0] is None else float(row[0])
            rows = self._exec(cur, "SELECT manifest FROM versions").fetchall()
            manifests = {str(r[0]) for r in rows}
            archives: set[str] = set()
            for (text,) in self._exec(
                cur, "SELECT info FROM handles WHERE info LIKE ?", ('%"archive"%',)
            ).fetchall():
                archive = json.loads(text).get("archive")
                if isinstance(archive, dict):
                    archives.update(
                        str(v[1]) for v in archive.values() if isinstance(v, list) and len(v) == 2
                    )
            return manifests, archives, oldest

        return await self._tx(run, write=False)

    # -- captures -----------------------------------------------------------------

    async def begin_capture(self, capture_id: str, holder: str, ttl_s: float) -> float:
        """Register an in-flight blob writer before its first ``put``; return its start time.

        The row protects every blob written after its start from the
        collector until it ends or expires (``ttl_s`` unless renewed with
        :meth:`renew_captures`): a crashed writer stops protecting.
        """

        def run(cur: Any) -> float:
            now = time.time()
            self._exec(
                cur,
                "INSERT INTO captures (id, holder, started_at, expires_at) VALUES (?, ?, ?, ?)",
                (capture_id, holder, now, now + ttl_s),
            )
            return now

        return await self._tx(run)

    async def renew_captures(self, holder: str, ttl_s: float) -> int:
        """Extend every unexpired capture of ``holder``; return how many.

        An expired one is never revived: the collector may already have
        ignored it, so its writer must fail rather than commit.
        """

        def run(cur: Any) -> int:
            now = time.time()
            cur = self._exec(
                cur,
                "UPDATE captures SET expires_at = ? WHERE holder = ? AND expires_at >= ?",
                (now + ttl_s, holder, now),
            )
            return int(cur.rowcount)

        return await self._tx(run)

    def _finish_capture(self, cur: Any, capture_id: str) -> None:
        cur = self._exec(
            cur,
            "DELETE FROM captures WHERE id = ? AND expires_at >= ?",
            (capture_id, time.time()),
        )
        if not cur.rowcount:
            raise ServiceError(
                "the capture's registration expired before its commit (its blobs may be gone)",
                code="failed",
            )

    async def end_capture(self, capture_id: str, *, check: bool = False) -> None:
        """Drop a capture's row (abort, or the end of a writer that committed in steps).

        Args:
            capture_id: The capture.
            check: Raise ``failed`` when it had expired (what it wrote may be gone).
        """

        def run(cur: Any) -> None:
            if check:
                self._finish_capture(cur, capture_id)
            else:
                self._exec(cur, "DELETE FROM captures WHERE id = ?", (capture_id,))

        await self._tx(run)

    async def drop_expired_captures(self, before: float) -> int:
        """Delete capture rows that expired before ``before`` (housekeeping); return how many."""

        def run(cur: Any) -> int:
            cur = self._exec(cur, "DELETE FROM captures WHERE expires_at < ?", (before,))
            return int(cur.rowcount)

        return await self._tx(run)

    # -- leases -------------------------------------------------------------------

    @staticmethod
    def _lease(row: Sequence[Any]) -> Lease:
        return Lease(row[0], row[1], float(row[2]), row[3], float(row[4]))

    async def acquire_lease(self, workspace_id: str, holder: str, ttl_s: float) -> Lease:
        """Take or renew a workspace's lease; return the row as it now is.

        The row goes to ``holder`` only when there is none, it expired, or it
        is ``holder``'s already: compare the returned ``holder`` to know.
        One atomic upsert, so two replicas racing cannot both win.
        """

        def run(cur: Any) -> Lease:
            now = time.time()
            self._exec(
                cur,
                "INSERT INTO leases (workspace_id, holder, expires_at, ref, last_used)"
                " VALUES (?, ?, ?, NULL, ?)"
                " ON CONFLICT (workspace_id) DO UPDATE SET holder = excluded.holder,"
                " expires_at = excluded.expires_at"
                " WHERE leases.holder = excluded.holder OR leases.expires_at < ?",
                (workspace_id, holder, now + ttl_s, now, now),
            )
            row = self._exec(
                cur,
                "SELECT workspace_id, holder, expires_at, ref, last_used FROM leases"
                " WHERE workspace_id = ?",
                (workspace_id,),
            ).fetchone()
            return self._lease(row)

        return await self._tx(run)

    async def renew_leases(self, holder: str, ttl_s: float) -> int:
        """Extend every lease ``holder`` holds; return how many."""

        def run(cur: Any) -> int:
            cur = self._exec(
                cur,
                "UPDATE leases SET expires_at = ? WHERE holder = ?",
                (time.time() + ttl_s, holder),
            )
            return int(cur.rowcount)

        return await self._tx(run)

    async def set_lease_ref(self, workspace_id: str, holder: str, ref: str | None) -> bool:
        """Record the live box's ref on ``holder``'s lease; False if the lease is not its."""

        def run(cur: Any) -> bool:
            cur = self._exec(
                cur,
                "UPDATE leases SET ref = ?, last_used = ? WHERE workspace_id = ? AND holder = ?",
                (ref, time.time(), workspace_id, holder),
            )
            return bool(cur.rowcount)

        return await self._tx(run)

    async def lease_holder(self, workspace_id: str) -> str | None:
        """Who holds the workspace's lease now (a read: no write, no fsync)."""

        def run(cur: Any) -> str | None:
            row = self._exec(
                cur, "SELECT holder FROM leases WHERE workspace_id = ?", (workspace_id,)
            ).fetchone()
            return None if row is None else str(row[0])

        return await self._tx(run, write=False)

    async def release_lease(self, workspace_id: str, holder: str) -> None:
        """Drop ``holder``'s lease (after the live box was closed)."""

        def run(cur: Any) -> None:
            self._exec(
                cur,
                "DELETE FROM leases WHERE workspace_id = ? AND holder = ?",
                (workspace_id, holder),
            )

        await self._tx(run)

    async def get_lease(self, workspace_id: str) -> Lease | None:
        """The workspace's lease row, expired or not."""

        def run(cur: Any) -> Lease | None:
            row = self._exec(
                cur,
                "SELECT workspace_id, holder, expires_at, ref, last_used FROM leases"
                " WHERE workspace_id = ?",
                (workspace_id,),
            ).fetchone()
            return None if row is None else self._lease(row)

        return await self._tx(run, write=False)

    async def leases_of(self, holder: str) -> list[Lease]:
        """Every lease ``holder`` holds."""

        def run(cur: Any) -> list[Lease]:
            rows = self._exec(
                cur,
                "SELECT workspace_id, holder, expires_at, ref, last_used FROM leases"
                " WHERE holder = ?",
                (holder,),
            ).fetchall()
            return [self._lease(r) for r in rows]

        return await self._tx(run, write=False)

    # -- handles ------------------------------------------------------------------

    @staticmethod
    def _handle(row: Sequence[Any]) -> HandleRecord:
        return HandleRecord(
            row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), float(row[6])
        )

    _H_COLUMNS: Final = "id, workspace_id, process_id, kind, command, info, created_at"

    async def insert_handle(self, h: HandleRecord) -> None:
        """Record a new handle."""

        def run(cur: Any) -> None:
            self._exec(
                cur,
                f"INSERT INTO handles ({self._H_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",  # noqa: S608 - constant names; values are bound
                (
                    h.id,
                    h.workspace_id,
                    h.process_id,
                    h.kind,
                    h.command,
                    json.dumps(dict(h.info)),
                    h.created_at,
                ),
            )

        await self._tx(run)

    async def get_handle(self, workspace_id: str, handle_id: str) -> HandleRecord:
        """A handle of a workspace.

        Raises:
            ServiceError: ``not_found``.
        """

        def run(cur: Any) -> HandleRecord:
            row = self._exec(
                cur,
                f"SELECT {self._H_COLUMNS} FROM handles WHERE id = ? AND workspace_id = ?",  # noqa: S608 - constant names; values are bound
                (handle_id, workspace_id),
            ).fetchone()
            if row is None:
                raise ServiceError("no such handle", code="not_found")
            return self._handle(row)

        return await self._tx(run, write=False)

    async def handle_view(
        self, project: str, workspace_id: str, handle_id: str
    ) -> tuple[WorkspaceRecord, HandleRecord, str | None]:
        """A project's workspace, one of its handles and its lease holder, in one read.

        Raises:
            ServiceError: ``not_found`` for the workspace (of this project) or the handle.
        """

        def run(cur: Any) -> tuple[WorkspaceRecord, HandleRecord, str | None]:
            rec = self._get_ws(cur, project, workspace_id)
            row = self._exec(
                cur,
                f"SELECT {self._H_COLUMNS} FROM handles WHERE id = ? AND workspace_id = ?",  # noqa: S608 - constant names; values are bound
                (handle_id, workspace_id),
            ).fetchone()
            if row is None:
                raise ServiceError("no such handle", code="not_found")
            lease = self._exec(
                cur, "SELECT holder FROM leases WHERE workspace_id = ?", (workspace_id,)
            ).fetchone()
            return rec, self._handle(row), None if lease is None else str(lease[0])

        return await self._tx(run, write=False)

    async def list_handles(self, workspace_id: str) -> list[HandleRecord]:
        """Every handle of a workspace, oldest first."""

        def run(cur: Any) -> list[HandleRecord]:
            rows = self._exec(
                cur,
                f"SELECT {self._H_COLUMNS} FROM handles WHERE workspace_id = ?"  # noqa: S608 - constant names; values are bound
                " ORDER BY created_at, id",
                (workspace_id,),
            ).fetchall()
            return [self._handle(r) for r in rows]

        return await self._tx(run, write=False)

    async def update_handle_info(
        self, handle_id: str, info: dict[str, Any], *, capture_id: str | None = None
    ) -> None:
        """Record what is now known of a handle's process.

        Args:
            handle_id: The handle.
            info: Its info (with an ``archive`` naming blobs, at a stop).
            capture_id: The capture that wrote those blobs: refused
                (``failed``) when it expired; it stays registered.
        """

        def run(cur: Any) -> None:
            if (
                capture_id is not None
                and not self._exec(
                    cur,
                    "SELECT 1 FROM captures WHERE id = ? AND expires_at >= ?",
                    (capture_id, time.time()),
                ).fetchone()
            ):
                raise ServiceError(
                    "the capture's registration expired before its commit", code="failed"
                )
            self._exec(
                cur, "UPDATE handles SET info = ? WHERE id = ?", (json.dumps(info), handle_id)
            )

        await self._tx(run)
