"""What an error message may repeat of what a caller sent.

Messages name the caller's value only when it is a short, printable string:
anything else could smuggle control characters, fake log lines or a flood
of text into an operator's log or a model's prompt. One rule, one place.
"""

from __future__ import annotations

__all__ = ["echo_if_short"]


def echo_if_short(value: object, *, limit: int = 64, fallback: str = "?") -> str:
    """``value`` itself if it is a printable ``str`` of at most ``limit`` characters.

    Args:
        value: What the caller sent (anything: it is untrusted).
        limit: The longest value worth repeating.
        fallback: What the message says instead (``"?"``, ``"the configured image"``).
    """
    if isinstance(value, str) and len(value) <= limit and value.isprintable():
        return value
    return fallback
