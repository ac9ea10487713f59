"""A rate-limited audit trail of accepted and rejected commands."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Final

__all__ = ["AuditLog"]

_MAX_SHOWN: Final = 500


def _shown(command: str) -> str:
    # repr() keeps a record on one line, so a command cannot forge log lines.
    text = command if len(command) <= _MAX_SHOWN else command[:_MAX_SHOWN] + "..."
    return repr(text)


class AuditLog:
    """Writes one record per command decision, at most ``max_per_minute`` a minute.

    A token bucket refills continuously; records over the budget are counted
    and the count is reported (``WARNING``) with the next record that fits.

    Args:
        logger: Where records go.
        max_per_minute: Budget of records per minute (the bucket's size).
        clock: Monotonic clock, replaceable in tests.
    """

    def __init__(
        self,
        logger: logging.Logger,
        max_per_minute: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_per_minute < 1:
            raise ValueError("audit_max_per_minute must be at least 1")
        self.logger = logger
        self._rate = max_per_minute / 60.0
        self._capacity = float(max_per_minute)
        self._tokens = float(max_per_minute)
        self._clock = clock
        self._stamp = clock()
        self._lock = threading.Lock()
        self._pending_suppressed = 0
        self.suppressed_total = 0

    def _admit(self) -> tuple[bool, int]:
        with self._lock:
            now = self._clock()
            self._tokens = min(self._capacity, self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now
            if self._tokens < 1.0:
                self._pending_suppressed += 1
                self.suppressed_total += 1
                return False, 0
            self._tokens -= 1.0
            pending, self._pending_suppressed = self._pending_suppressed, 0
            return True, pending

    def _admit_level(self, level: int) -> bool:
        """Spend a token and report pending suppressions; whether to build the record.

        Every decision spends a token whether or not ``level`` is enabled, so
        the budget and the suppressed count do not depend on logging config;
        only the formatting is skipped for a disabled level.
        """
        admitted, suppressed = self._admit()
        if not admitted:
            return False
        if suppressed:
            self.logger.warning(
                "%d shell audit records suppressed by the rate limit",
                suppressed,
                extra={"corral_audit": {"event": "suppressed", "count": suppressed}},
            )
        return self.logger.isEnabledFor(level)

    def accepted(self, command: str, cwd: str, env_names: Iterable[str]) -> None:
        """Record an accepted command (variable names only, never values)."""
        if not self._admit_level(logging.INFO):
            return
        names = sorted(env_names)
        self.logger.info(
            "accepted command=%s cwd=%s env=%s",
            _shown(command),
            repr(cwd),
            names,
            extra={
                "corral_audit": {
                    "event": "accepted",
                    "command": command[:_MAX_SHOWN],
                    "cwd": cwd,
                    "env": names,
                }
            },
        )

    def rejected(self, command: str, reason: str) -> None:
        """Record a rejected command with the rule that refused it."""
        if not self._admit_level(logging.WARNING):
            return
        self.logger.warning(
            "rejected command=%s reason=%s",
            _shown(command),
            reason,
            extra={
                "corral_audit": {
                    "event": "rejected",
                    "command": command[:_MAX_SHOWN],
                    "reason": reason,
                }
            },
        )
