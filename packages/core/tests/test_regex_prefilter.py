"""The literal prefilter and ``search_bytes``: fast paths that must agree with the slow one."""

from __future__ import annotations

from typing import Any

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from corral import Re2Engine, RegexModuleEngine
from corral._prefilter import required_literal, single_line
from corral._regex import _scan

_ATOMS = ["a", "b", "é", "K", "_", "1", r"\.", ".", r"\w", r"\d", r"\s", "[a-c]", "[^b]", "(ab|c)"]
_QUANTS = ["", "", "", "*", "+", "?", "{1,2}"]
# Non-ASCII letters whose case folds reach ASCII (Kelvin sign, long s) and U+FFFD.
_TEXT_CHARS = "ab_1. \t\r\n\n\néKkS\u017f\u212a\ufffd"


@st.composite
def patterns(draw: st.DrawFn) -> str:
    pieces = draw(
        st.lists(
            st.tuples(st.sampled_from(_ATOMS), st.sampled_from(_QUANTS)), min_size=1, max_size=5
        )
    )
    body = "".join(a + q for a, q in pieces)
    anchors = draw(st.sampled_from(["", "^", "$"]))
    body = anchors + body if anchors == "^" else body + anchors
    if draw(st.booleans()) and draw(st.booleans()):
        body += "|" + draw(st.sampled_from(["ab", "é", r"\d"]))
    return body


texts = st.text(alphabet=_TEXT_CHARS, max_size=60)
raw = st.lists(
    st.sampled_from(
        [b"a", b"b", b"_", b"1", b"\n", b"\r\n", b"\xc3\xa9", b"\xe2\x84\xaa", b"\xff", b"\xc3"]
    ),
    max_size=40,
).map(b"".join)


def _reference(pattern: str, text: str, limit: int, *, ignore_case: bool) -> list[tuple[int, str]]:
    """The plain scan with no prefilter at all: the slow path."""
    flags = regex.MULTILINE | (regex.IGNORECASE if ignore_case else 0)
    return _scan(regex.compile(pattern, flags).search, text, limit, None)


_ENGINE = RegexModuleEngine(refuse_catastrophic=False)


@settings(max_examples=100, deadline=None)
@given(pattern=patterns(), text=texts, ignore_case=st.booleans(), limit=st.integers(1, 4))
def test_fast_paths_agree_with_plain_scan(
    pattern: str, text: str, ignore_case: bool, limit: int
) -> None:
    matcher: Any = _ENGINE.compile(pattern, ignore_case=ignore_case)
    expected = _reference(pattern, text, limit, ignore_case=ignore_case)
    assert matcher.search_lines(text, limit) == expected
    assert matcher.search_bytes(text.encode("utf-8"), limit) == expected


@settings(max_examples=60, deadline=None)
@given(pattern=patterns(), data=raw)
def test_search_bytes_on_invalid_utf8_matches_decoded_text(pattern: str, data: bytes) -> None:
    matcher: Any = _ENGINE.compile(pattern)
    expected = _reference(pattern, data.decode("utf-8", errors="replace"), 10, ignore_case=False)
    assert matcher.search_bytes(data, 10) == expected


@settings(max_examples=100, deadline=None)
@given(pattern=patterns(), text=texts)
def test_required_literal_is_in_every_match(pattern: str, text: str) -> None:
    literal = required_literal(pattern)
    if literal is None:
        return
    for m in regex.finditer(pattern, text, regex.MULTILINE):
        assert literal in m.group()


@pytest.mark.parametrize(
    ("pattern", "literal"),
    [
        ("needle_[0-9]+", "needle_"),
        ("ab?c", "a"),
        ("a+bc", "bc"),
        (r"x\.y", "x.y"),
        (r"\d+foo", "foo"),
        ("a{2,3}bcd", "bcd"),
        ("[]a]xy", "xy"),
        ("foo(bar|baz)qux", "foo"),
        (r"ab\sc", "ab"),
        ("a|b", None),
        ("(?i)abc", None),
        (r"\x41bc", None),
        (r"\N{LATIN SMALL LETTER E}xyz", None),
        ("ab[[:alpha:]]", None),
        ("^$", None),
        ("a*", None),
    ],
)
def test_required_literal_examples(pattern: str, literal: str | None) -> None:
    assert required_literal(pattern) == literal


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("needle_[0-9]+", True),
        (r"a.b\.c{2,3}", True),
        (r"\w+_1", True),
        (r"a\sb", False),
        ("[^x]b", False),
        (r"[\t-z]b", False),
        ("[\t-z]b", False),
        (r"a\nb", False),
        ("a\nb", False),
        ("a{e<=1}b", False),
        (r"\Zab", False),
        ("[[:space:]]ab", False),
    ],
)
def test_single_line_examples(pattern: str, expected: bool) -> None:
    assert single_line(pattern) is expected


@settings(max_examples=100, deadline=None)
@given(pattern=patterns(), text=texts)
def test_single_line_matches_hold_no_newline(pattern: str, text: str) -> None:
    if single_line(pattern):
        for m in regex.finditer(pattern, text, regex.MULTILINE):
            assert "\n" not in m.group()


def test_prefilter_skips_files_without_the_literal() -> None:
    matcher: Any = _ENGINE.compile("needle_[0-9]+")
    assert matcher.search_bytes(b"needle\n" * 50 + b"_x\n", 5) == []
    data = b"x\r\n" + b"e" * 40 + b" needle_42\r\nneedle_\n  needle_7"
    assert matcher.search_bytes(data, 5) == [(2, "e" * 40 + " needle_42"), (4, "  needle_7")]
    assert matcher.search_bytes(data, 1) == [(2, "e" * 40 + " needle_42")]
    # The rare byte ("_") turns up many times before the literal does.
    crowded = b"_" * 30 + b"\nx_needle\n" + b"_" * 30 + b"needle_9\n"
    assert matcher.search_bytes(crowded, 5) == [(3, "_" * 30 + "needle_9")]
    assert matcher.search_lines(crowded.decode(), 5) == [(3, "_" * 30 + "needle_9")]
    assert matcher.search_bytes(b"_" * 30 + b"needle", 5) == []


@settings(max_examples=50, deadline=None)
@given(pattern=patterns(), text=texts, ignore_case=st.booleans())
def test_re2_fast_paths_agree(pattern: str, text: str, ignore_case: bool) -> None:
    matcher: Any = Re2Engine().compile(pattern, ignore_case=ignore_case)
    slow = Re2Engine().compile(pattern, ignore_case=ignore_case)
    slow._prefilter = None  # the reference: the unfiltered scan
    expected = slow.search_lines(text, 10)
    assert matcher.search_lines(text, 10) == expected
    assert matcher.search_bytes(text.encode("utf-8"), 10) == expected
