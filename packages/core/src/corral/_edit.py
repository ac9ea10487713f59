"""``edit_file``'s text semantics: one implementation every provider calls.

A provider reads the file its own way (a dict, a directory fd, a container),
hands the bytes here, and writes back what comes out; so "exactly one match
unless replace_all", the error codes and their words are the same on every
provider (the conformance suite checks that they are).
"""

from __future__ import annotations

from ._errors import OperationError

__all__ = ["apply_edit"]


def apply_edit(
    data: bytes, old_text: str, new_text: str, *, replace_all: bool, where: str
) -> tuple[bytes, int]:
    """The one implementation of ``edit_file``'s text semantics, for every provider.

    Args:
        data: The file's current bytes.
        old_text: Text to find (non-empty).
        new_text: Replacement.
        replace_all: Replace every occurrence instead of requiring exactly one.
        where: The agent-view path, for messages.

    Returns:
        The new bytes and how many occurrences were replaced.

    Raises:
        OperationError: ``invalid_argument`` (empty old_text),
            ``unsupported_file_type`` (not UTF-8), ``no_match``, ``not_unique``.
    """
    if not old_text:
        raise OperationError("old_text must not be empty", code="invalid_argument")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise OperationError(f"{where} is not UTF-8 text", code="unsupported_file_type") from None
    count = text.count(old_text)
    if count == 0:
        raise OperationError(f"old_text was not found in {where}", code="no_match")
    if count > 1 and not replace_all:
        raise OperationError(
            f"old_text occurs {count} times in {where}; give more context or set replace_all",
            code="not_unique",
        )
    updated = (
        text.replace(old_text, new_text) if replace_all else text.replace(old_text, new_text, 1)
    )
    try:
        encoded = updated.encode("utf-8")
    except UnicodeEncodeError:
        raise OperationError("new_text is not valid Unicode", code="invalid_argument") from None
    return encoded, count if replace_all else 1
