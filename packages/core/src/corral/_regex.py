"""Regex engines for grep: bounded in time, or linear by construction.

The default engine uses the ``regex`` module, whose searches accept a
timeout, plus a heuristic that refuses patterns with nested quantifiers
before they can backtrack. ``google-re2`` (``pip install 'corral-core[re2]'``)
is linear-time; with it the heuristic only warns.

Who uses what, and why it lives in core. The engine is the agent builder's
choice (``open_workspace(regex_engine=...)``), so :class:`RegexEngine`,
:class:`RegexModuleEngine`, :class:`Re2Engine` and :func:`get_regex_engine`
are exported by ``corral`` (and, for capabilities that search,
``corral.capability``). The fs capability compiles the model's pattern with
it and hands the provider a :class:`Matcher`; :func:`bytes_searcher` (with
the literal prefilter of ``_prefilter.py``) is how a provider's grep runs
that matcher fast over raw bytes, so those are exported by
``corral.provider``. It is not contract (no protocol depends on the engines)
but it stays in core: in-memory and the POSIX providers both search with it,
and providers never import each other. ``LineSearch`` and
``looks_catastrophic`` are implementation details, not exported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final, Protocol, runtime_checkable

import regex

from ._errors import OperationError
from ._prefilter import Prefilter

__all__ = [
    "LineSearch",
    "Matcher",
    "Re2Engine",
    "RegexEngine",
    "RegexModuleEngine",
    "bytes_searcher",
    "get_regex_engine",
    "looks_catastrophic",
]

log = logging.getLogger("corral.regex")

MAX_PATTERN_LENGTH: Final = 2000

# A group that contains a quantifier and is itself quantified: (a+)+, (a|aa)*,
# (\w+\s?)*, the shapes behind nearly every ReDoS report. Backreferences are
# refused too: no engine runs them in linear time.
_NESTED_QUANTIFIER: Final = regex.compile(
    r"\((?:[^()\\]|\\.)*(?:[*+]|\{\d*,?\d*\})(?:[^()\\]|\\.)*\)(?:[*+]|\{\d*,?\d*\})"
)
_ALTERNATION_REPEAT: Final = regex.compile(r"\((?:[^()\\]|\\.)*\|(?:[^()\\]|\\.)*\)[*+]")
_BACKREFERENCE: Final = regex.compile(r"\\[1-9]|\(\?P=")


def looks_catastrophic(pattern: str) -> bool:
    """Whether a pattern has a shape known to backtrack exponentially."""
    return bool(
        _NESTED_QUANTIFIER.search(pattern)
        or _ALTERNATION_REPEAT.search(pattern)
        or _BACKREFERENCE.search(pattern)
    )


@runtime_checkable
class Matcher(Protocol):
    """A compiled pattern that reports matching lines of a text."""

    @property
    def pattern(self) -> str:
        """The source pattern."""
        ...

    def search_lines(self, text: str, limit: int) -> list[tuple[int, str]]:
        """Return up to ``limit`` ``(line_number, line)`` pairs, numbered from 1.

        Raises:
            OperationError: ``code="timeout"`` when the search ran out of time.
        """
        ...


@runtime_checkable
class RegexEngine(Protocol):
    """Compiles grep patterns into matchers."""

    @property
    def name(self) -> str:
        """Engine name (``regex`` or ``re2``)."""
        ...

    def compile(self, pattern: str, *, ignore_case: bool = False) -> Matcher:
        """Compile a pattern.

        Raises:
            OperationError: ``code="invalid_argument"`` for a bad or refused pattern.
        """
        ...


def _check_length(pattern: str) -> None:
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise OperationError(
            f"pattern is longer than {MAX_PATTERN_LENGTH} characters", code="invalid_argument"
        )


def _scan(search: Any, text: str, limit: int, prefilter: Prefilter | None) -> list[tuple[int, str]]:
    """Walk matches with ``search(text, pos)``, one result per line.

    The prefilter moves ``pos`` past text where no match can start and stops
    the scan once the literal no longer occurs, rather than running the
    regex over the rest of the text.
    """
    found: list[tuple[int, str]] = []
    pos = 0
    line_no = 1
    counted_to = 0
    size = len(text)
    while pos <= size and len(found) < limit:
        if prefilter is not None:
            pos = prefilter.next_start(text, pos)
            if pos < 0:
                break
        m = search(text, pos)
        if m is None:
            break
        start = m.start()
        line_start = text.rfind("\n", 0, start) + 1
        line_end = text.find("\n", start)
        if line_end < 0:
            line_end = size
        line_no += text.count("\n", counted_to, line_start)
        counted_to = line_start
        found.append((line_no, text[line_start:line_end].removesuffix("\r")))
        pos = line_end + 1
    return found


def _scan_candidate_lines(
    search: Any, text: str, limit: int, prefilter: Prefilter
) -> list[tuple[int, str]]:
    """:func:`_scan` for a single-line pattern: search each line holding the literal alone.

    google-re2 converts between character and byte offsets over the whole
    text on every call with a position, so searching one short line is far
    cheaper. A match of a pattern that cannot span lines lies inside one
    line, and a line's ends look the same to ``^``, ``$`` (multiline),
    ``\\b`` and ``\\B`` whether it is searched alone or in place (``\\A``,
    ``\\z`` and lookaround never pass :func:`single_line` or the prefilter).
    """
    found: list[tuple[int, str]] = []
    pos = 0
    line_no = 1
    counted_to = 0
    size = len(text)
    while pos <= size and len(found) < limit:
        line_start = prefilter.next_start(text, pos)
        if line_start < 0:
            break
        line_end = text.find("\n", line_start)
        if line_end < 0:
            line_end = size
        line = text[line_start:line_end]
        if search(line) is not None:
            line_no += text.count("\n", counted_to, line_start)
            counted_to = line_start
            found.append((line_no, line.removesuffix("\r")))
        pos = line_end + 1
    return found


class _PrefilteredMatcher:
    """What core's matchers share: the source pattern and the prefiltered bytes path.

    Subclasses supply :meth:`search_lines`; a file the prefilter rules out is
    never decoded.
    """

    def __init__(self, compiled: Any, pattern: str, prefilter: Prefilter | None) -> None:
        self._compiled = compiled
        self._pattern = pattern
        self._prefilter = prefilter

    @property
    def pattern(self) -> str:
        return self._pattern

    def search_bytes(self, data: bytes, limit: int) -> list[tuple[int, str]]:
        """:meth:`search_lines` on ``data`` decoded as UTF-8 (errors replaced)."""
        if self._prefilter is not None and not self._prefilter.in_data(data):
            return []
        return self.search_lines(data.decode("utf-8", errors="replace"), limit)

    def search_lines(self, text: str, limit: int) -> list[tuple[int, str]]:
        raise NotImplementedError


class _RegexModuleMatcher(_PrefilteredMatcher):
    def __init__(
        self, compiled: Any, pattern: str, timeout_s: float, prefilter: Prefilter | None
    ) -> None:
        super().__init__(compiled, pattern, prefilter)
        self._timeout_s = timeout_s

    def search_lines(self, text: str, limit: int) -> list[tuple[int, str]]:
        deadline = time.monotonic() + self._timeout_s
        compiled = self._compiled

        def search(t: str, pos: int) -> Any:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            return compiled.search(t, pos, timeout=remaining)

        try:
            return _scan(search, text, limit, self._prefilter)
        except TimeoutError:
            raise OperationError(
                f"pattern took longer than {self._timeout_s:g}s on one file; simplify it",
                code="timeout",
            ) from None


class RegexModuleEngine:
    """The default engine: the ``regex`` module with a per-file timeout.

    Args:
        timeout_s: Wall-clock budget for searching one file.
        refuse_catastrophic: Refuse patterns :func:`looks_catastrophic` flags.
    """

    name = "regex"

    def __init__(self, *, timeout_s: float = 2.0, refuse_catastrophic: bool = True) -> None:
        self.timeout_s = timeout_s
        self.refuse_catastrophic = refuse_catastrophic

    def compile(self, pattern: str, *, ignore_case: bool = False) -> Matcher:
        """Compile with the ``regex`` module (V1 semantics off, like ``re``)."""
        _check_length(pattern)
        if self.refuse_catastrophic and looks_catastrophic(pattern):
            raise OperationError(
                "pattern has nested quantifiers or backreferences that can backtrack "
                "catastrophically; simplify it",
                code="invalid_argument",
            )
        flags = regex.MULTILINE | (regex.IGNORECASE if ignore_case else 0)
        try:
            compiled = regex.compile(pattern, flags)
        except (regex.error, ValueError, OverflowError) as exc:
            raise OperationError(
                f"invalid regular expression: {exc}", code="invalid_argument"
            ) from None
        prefilter = None if ignore_case else Prefilter.for_pattern(pattern)
        return _RegexModuleMatcher(compiled, pattern, self.timeout_s, prefilter)


class _Re2Matcher(_PrefilteredMatcher):
    def search_lines(self, text: str, limit: int) -> list[tuple[int, str]]:
        prefilter = self._prefilter
        if prefilter is not None and prefilter.single_line:
            return _scan_candidate_lines(self._compiled.search, text, limit, prefilter)
        return _scan(self._compiled.search, text, limit, prefilter)


class Re2Engine:
    """Linear-time matching with ``google-re2``; no timeout is needed."""

    name = "re2"

    def __init__(self) -> None:
        try:
            import re2
        except ImportError as exc:
            raise ImportError(
                "the re2 regex engine needs google-re2: pip install 'corral-core[re2]'"
            ) from exc
        self._re2 = re2

    def compile(self, pattern: str, *, ignore_case: bool = False) -> Matcher:
        """Compile with RE2 (no backreferences or lookaround)."""
        _check_length(pattern)
        if looks_catastrophic(pattern):
            log.info("re2 engine: pattern would be refused by the heuristic; RE2 runs it linearly")
        source = ("(?im)" if ignore_case else "(?m)") + pattern
        try:
            compiled = self._re2.compile(source)
        except Exception as exc:  # re2 raises its own error type, or ValueError
            raise OperationError(
                f"invalid regular expression for RE2: {exc}", code="invalid_argument"
            ) from None
        prefilter = None if ignore_case else Prefilter.for_pattern(pattern)
        return _Re2Matcher(compiled, pattern, prefilter)


LineSearch = Callable[[bytes, int], list[tuple[int, str]]]
"""Search UTF-8 file bytes: ``(data, limit) -> [(line_number, line), ...]``."""


def bytes_searcher(matcher: Matcher) -> LineSearch:
    """``matcher`` over raw file bytes, through its prefiltered fast path when it has one.

    corral's own matchers have ``search_bytes``, which skips files lacking the
    pattern's required literal without decoding them; any other
    :class:`Matcher` is served by decoding (UTF-8, invalid bytes replaced)
    and calling ``search_lines``. Providers call this once per grep.
    """
    fast = getattr(matcher, "search_bytes", None)
    if callable(fast):
        search: LineSearch = fast
        return search

    def decode_then_search(data: bytes, limit: int) -> list[tuple[int, str]]:
        return matcher.search_lines(data.decode("utf-8", errors="replace"), limit)

    return decode_then_search


def get_regex_engine(name: str = "regex") -> RegexEngine:
    """Return an engine by name: ``regex`` (default) or ``re2``."""
    if name == "regex":
        return RegexModuleEngine()
    if name == "re2":
        return Re2Engine()
    raise ValueError(f"unknown regex engine {name!r}; choose 'regex' or 're2'")
