"""The one error type of the service: a status, a stable code and a message safe to show.

Messages name the field or the kind of thing that was wrong, never the
value a client sent: the value is untrusted and may be large, binary or
crafted to mislead whoever reads the log.
"""

from __future__ import annotations

from typing import Final

__all__ = ["STATUS_OF", "ServiceError"]

STATUS_OF: Final[dict[str, int]] = {
    "invalid_argument": 400,
    "unauthenticated": 401,
    "forbidden": 403,
    "not_found": 404,
    "operation_failed": 422,
    "conflict": 409,
    "busy": 409,
    "cursor_expired": 410,
    "too_large": 413,
    "unsupported": 415,
    "failed": 500,
    "unavailable": 503,
}
"""HTTP status of each error code the API returns."""


class ServiceError(Exception):
    """A request the service refuses or cannot complete.

    Args:
        message: A sentence safe to return to the client (no echoed input).
        code: A stable code (a key of :data:`STATUS_OF`).
        extra: More machine-readable fields for the error body
            (``earliest`` of ``cursor_expired``).
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "invalid_argument",
        extra: dict[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.extra = dict(extra or {})

    @property
    def status(self) -> int:
        """The HTTP status this error answers with."""
        return STATUS_OF.get(self.code, 500)

    def body(self) -> dict[str, object]:
        """The JSON error body: ``{"error": {"code", "message", ...extra}}``."""
        return {"error": {"code": self.code, "message": self.message, **self.extra}}
