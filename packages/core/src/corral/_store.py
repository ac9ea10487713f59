"""An embedded store of session id -> persisted ref (stdlib sqlite3), used by the CLI.

The database lives under ``$CORRAL_STATE_DIR`` or, by default,
``$XDG_STATE_HOME/corral`` (``~/.local/state/corral``), created 0700 with the
file 0600: refs hold no secrets, but they name where workspaces live. Rows
are validated on the way out exactly like any untrusted ref.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import anyio.to_thread
import attrs

from ._data import WorkspaceRef
from ._errors import ConfigError
from ._refs import ref_from_json, ref_to_json

__all__ = ["STATE_ENV", "RefStore", "StoredSession", "default_state_path"]

STATE_ENV: Final = "CORRAL_STATE_DIR"

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    provider_kind TEXT NOT NULL,
    ref_json TEXT,
    capabilities_json TEXT,
    provider_options_json TEXT NOT NULL DEFAULT '{}',
    updated_at REAL NOT NULL
)
"""


def default_state_path() -> Path:
    """Where the CLI keeps its session database."""
    base = os.environ.get(STATE_ENV)
    if base:
        return Path(base) / "sessions.sqlite3"
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "corral" / "sessions.sqlite3"


@attrs.frozen
class StoredSession:
    """One row of the store."""

    session_id: str
    provider_kind: str
    ref: WorkspaceRef | None
    capabilities: Mapping[str, Any] | None
    provider_options: Mapping[str, Any]
    updated_at: float


class RefStore:
    """Session id -> ref, capabilities and provider options, shared across processes.

    Args:
        path: Database file (default :func:`default_state_path`).
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_state_path()

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fresh = not self.path.exists()
        conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        if fresh:
            os.chmod(self.path, 0o600)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(_SCHEMA)
        return conn

    def _run(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            conn = self._connect()
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"cannot open the session store at {self.path}: {exc}") from None
        try:
            with conn:
                return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    async def save(
        self,
        session_id: str,
        provider_kind: str,
        ref: WorkspaceRef | None,
        *,
        capabilities: Mapping[str, Any] | None = None,
        provider_options: Mapping[str, Any] | None = None,
    ) -> None:
        """Insert or replace a session's row."""
        row = (
            session_id,
            provider_kind,
            ref_to_json(ref) if ref is not None else None,
            json.dumps(dict(capabilities)) if capabilities is not None else None,
            json.dumps(dict(provider_options or {})),
            time.time(),
        )
        await anyio.to_thread.run_sync(
            self._run,
            "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?)",
            row,
        )

    async def load(self, session_id: str) -> StoredSession | None:
        """A session's row, or None.

        Raises:
            WorkspaceFailedError: The stored ref is not a well-formed ref.
        """
        rows = await anyio.to_thread.run_sync(
            self._run, "SELECT * FROM sessions WHERE session_id = ?", (session_id,)
        )
        return _row(rows[0]) if rows else None

    async def delete(self, session_id: str) -> bool:
        """Forget a session; True if it existed."""
        rows = await anyio.to_thread.run_sync(
            self._run,
            "DELETE FROM sessions WHERE session_id = ? RETURNING session_id",
            (session_id,),
        )
        return bool(rows)

    async def sessions(self) -> list[StoredSession]:
        """Every stored session, most recently used first."""
        rows = await anyio.to_thread.run_sync(
            self._run, "SELECT * FROM sessions ORDER BY updated_at DESC"
        )
        return [_row(r) for r in rows]


def _row(row: tuple[Any, ...]) -> StoredSession:
    session_id, kind, ref_json, caps_json, opts_json, updated = row
    return StoredSession(
        session_id=session_id,
        provider_kind=kind,
        ref=ref_from_json(ref_json) if ref_json is not None else None,
        capabilities=json.loads(caps_json) if caps_json is not None else None,
        provider_options=json.loads(opts_json),
        updated_at=updated,
    )
