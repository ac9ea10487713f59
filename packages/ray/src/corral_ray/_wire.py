"""What crosses the driver/agent boundary: replies and errors as plain tuples.

An exception raised inside a Ray actor reaches the caller pickled, with its
traceback, the agent's host paths and its class's module path; a model must
never see any of that. So the agent never lets an exception escape a call:
it encodes corral's own errors (whose messages are model-safe by contract)
into a tuple and replaces anything else with a fixed sentence, and the driver
rebuilds the very same error types from the tuple.
"""

from __future__ import annotations

import logging
from typing import Any, Final, cast, get_args

from corral.provider import (
    ConfigError,
    CursorExpiredError,
    ErrorCode,
    OperationError,
    WorkspaceEvictedError,
    WorkspaceFailedError,
)

__all__ = ["PROVIDER_ID", "Reply", "decode", "encode_error", "full", "ok"]

log = logging.getLogger("corral.ray")

PROVIDER_ID: Final = "ray"

Reply = tuple[Any, ...]
"""``("ok", value)`` or ``("err", kind, message, extra)``."""

_CODES: Final = frozenset(get_args(ErrorCode))
_UNEXPECTED: Final = "the workspace's node agent failed the operation unexpectedly"


def ok(value: Any) -> Reply:
    """A successful reply."""
    return ("ok", value)


def full(message: str) -> Reply:
    """The agent's node has no room: the driver tries another node, then waits."""
    return ("err", "full", message, None)


def encode_error(exc: BaseException) -> Reply:
    """A failed reply: corral's errors keep type, code and message; others become one sentence.

    An unexpected error is logged on the agent (for operators) and never
    forwarded: its text may hold host paths or environment values.
    """
    if isinstance(exc, CursorExpiredError):
        return ("err", "cursor_expired", exc.message, exc.earliest)
    if isinstance(exc, OperationError):
        return ("err", "operation", exc.message, exc.code)
    if isinstance(exc, WorkspaceEvictedError):
        return ("err", "evicted", exc.message, None)
    if isinstance(exc, ConfigError):
        return ("err", "config", str(exc), None)
    if isinstance(exc, WorkspaceFailedError):
        return ("err", "failed", exc.message, exc.transient)
    log.warning("corral-ray agent: unexpected %s in a workspace call", type(exc).__name__)
    return ("err", "operation", _UNEXPECTED, "failed")


def decode(reply: Reply) -> Any:
    """The value of a reply, or raise the error it carries.

    Raises:
        OperationError: Including :class:`CursorExpiredError`.
        WorkspaceEvictedError, WorkspaceFailedError, ConfigError: As the agent raised them.
    """
    if reply[0] == "ok":
        return reply[1]
    _, kind, message, extra = reply
    if kind == "operation":
        code = cast("ErrorCode", extra if extra in _CODES else "failed")
        raise OperationError(message, code=code)
    if kind == "cursor_expired":
        raise CursorExpiredError(message, earliest=int(extra))
    if kind == "evicted":
        raise WorkspaceEvictedError(message, provider_id=PROVIDER_ID)
    if kind == "full":
        raise WorkspaceFailedError(message, provider_id=PROVIDER_ID, transient=True)
    if kind == "config":
        raise ConfigError(message)
    raise WorkspaceFailedError(message, provider_id=PROVIDER_ID, transient=bool(extra))
