"""Running one file-system operation on the provider and the model, and comparing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from corral import FileEntry, FileStat, GrepResult, OperationError

from ._model import ModelError

__all__ = ["Outcome", "check_same", "model_outcome", "normalise"]


@attrs.frozen
class Outcome:
    """A value, or the error an operation raised."""

    value: Any = None
    error: BaseException | None = None


def model_outcome(fn: Callable[[], Any]) -> Outcome:
    """Run a model operation; a :class:`ModelError` becomes the outcome's error."""
    try:
        return Outcome(value=fn())
    except ModelError as exc:
        return Outcome(error=exc)


def normalise(value: Any) -> Any:
    """Reduce a result to what the contract fixes (sizes of directories are free)."""
    if isinstance(value, FileStat):
        return (value.path, value.type, value.size if value.type == "file" else None)
    if isinstance(value, FileEntry):
        return (value.name, value.path, value.type, value.size if value.type == "file" else None)
    if isinstance(value, GrepResult):
        return (
            tuple((m.path, m.line_number, m.line) for m in value.matches),
            tuple(sorted(value.skipped_binary_paths)),
            value.truncated,
        )
    if isinstance(value, bytes | str | int | type(None)):
        return value
    if isinstance(value, Sequence):
        return [normalise(v) for v in value]
    return value


def _is_empty(value: Any) -> bool:
    if isinstance(value, GrepResult):
        return not value.matches
    return isinstance(value, Sequence) and len(value) == 0


def check_same(what: str, got: Outcome, want: Outcome, *, grep_boundary: bool = False) -> None:
    """Assert the provider's outcome is one the model allows.

    Args:
        what: The operation, for the failure message.
        got: The provider's outcome.
        want: The model's outcome.
        grep_boundary: Exactly ``max_results`` matches exist, so ``truncated``
            may be either value.

    Raises:
        AssertionError: The outcomes disagree.
    """
    if want.error is not None:
        assert isinstance(want.error, ModelError)
        if got.error is None:
            assert want.error.empty_ok, (
                f"{what}: expected OperationError(code in {sorted(want.error.accepted)}), "
                f"got {got.value!r}"
            )
            assert _is_empty(got.value), (
                f"{what}: expected OperationError(code in {sorted(want.error.accepted)}), "
                f"got {got.value!r}"
            )
            return
        assert isinstance(got.error, OperationError), (
            f"{what}: expected OperationError(code in {sorted(want.error.accepted)}), "
            f"got {type(got.error).__name__}: {got.error}"
        )
        assert got.error.code in want.error.accepted, (
            f"{what}: expected code in {sorted(want.error.accepted)}, got {got.error.code!r} "
            f"({got.error.message})"
        )
        return
    if got.error is not None:
        raise AssertionError(
            f"{what}: expected {normalise(want.value)!r}, got "
            f"{type(got.error).__name__}"
            f"{'(' + repr(got.error.code) + ')' if isinstance(got.error, OperationError) else ''}"
            f": {got.error}"
        )
    mine, theirs = normalise(got.value), normalise(want.value)
    if isinstance(got.value, GrepResult) and isinstance(want.value, GrepResult):
        if want.value.truncated:
            # A search cut at max_results may stop walking: the binary files it
            # reports are then a subset of those the model saw.
            extra = set(got.value.skipped_binary_paths) - set(want.value.skipped_binary_paths)
            assert not extra, f"{what}: reported binary files that do not exist: {sorted(extra)}"
            mine, theirs = (mine[0], mine[2]), (theirs[0], theirs[2])
        if grep_boundary:
            mine, theirs = mine[:-1], theirs[:-1]
    assert mine == theirs, f"{what}: expected {theirs!r}, got {mine!r}"
