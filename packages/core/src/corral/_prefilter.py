"""A literal prefilter for grep patterns: skip text that cannot hold a match.

For a case-sensitive pattern, :func:`required_literal` finds the longest
literal every match must contain. A file whose bytes lack it is never decoded
or searched, and scans jump between occurrences. This is exact, not a
heuristic: a decoded character other than U+FFFD always comes from its own
UTF-8 bytes, and literals holding U+FFFD are excluded. Anything the scanner
does not fully understand (inline flags, alternation at the top level, unknown
escapes) yields no prefilter, never a wrong one.
"""

from __future__ import annotations

import string
from typing import AnyStr, Final

import regex

__all__ = ["Prefilter", "required_literal", "single_line"]


# Escapes that stand for a class, an anchor or one control character: they end
# a literal run. Any other letter or digit escape (\x41, \N{...}, \p{L}, \1)
# has a payload that must not be read as literal text, so it disables the
# prefilter.
_BREAK_ESCAPES: Final = frozenset("dDwWsSbBAZzntrfvaGmM")
# Bytes roughly from most to least frequent in text and source code; a byte
# not listed counts as rarer than all of them.
_COMMON_BYTES: Final = (
    b" e\ntaoinsrlhdcupmfgybw.v,k()=:;_'\"x-/0123456789ETAOINSRLHDCUPMFGYBWVK\t#*[]{}<>jqzJQZX"
)
_SAFE_ESCAPES: Final = frozenset("dwbBtrfva")
_SAFE_CLASS_ESCAPES: Final = frozenset("dw")
_NEWLINE: Final = 0x0A
_COUNTED: Final = regex.compile(r"\{\d*,?\d*\}")
# More hits than this on the rare byte and the plain substring search wins.
_RARE_HITS: Final = 8


def _skip_class(pattern: str, i: int) -> int:
    """Index just past the character class opening at ``pattern[i]``.

    Returns ``len(pattern) + 1`` (which makes the caller give up) for a class
    it does not parse.
    """
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern):
        c = pattern[j]
        if c == "\\":
            j += 2
        elif c == "[":
            break  # [[:alpha:]] and nested sets: not worth parsing
        elif c == "]":
            return j + 1
        else:
            j += 1
    return len(pattern) + 1


def required_literal(pattern: str) -> str | None:  # noqa: PLR0915 -- one scanner reads best whole
    """The longest literal every match of ``pattern`` contains, if one is provable.

    Only the top-level concatenation is read: groups, classes and escapes end
    a run, a quantifier that allows zero repeats drops the character before
    it, and a top-level ``|``, inline flags or any unfamiliar escape give
    ``None``. Case-sensitive matching is assumed.
    """
    if "(?" in pattern or "\\Q" in pattern:
        return None
    runs: list[str] = []
    run: list[str] = []
    last_literal = False
    depth = 0
    i = 0
    n = len(pattern)
    while i < n:
        c = pattern[i]
        literal: str | None = None
        if c == "\\":
            nxt = pattern[i + 1 : i + 2]
            i += 2
            if depth == 0:
                if nxt and nxt.isascii() and not nxt.isalnum():
                    literal = nxt
                elif nxt not in _BREAK_ESCAPES:
                    return None
        elif c == "[":
            i = _skip_class(pattern, i)
        elif c == "(":
            depth += 1
            i += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                return None
            i += 1
        elif depth:
            i += 1
            continue
        elif c == "|":
            return None
        elif c in "*?{":
            if last_literal:
                run.pop()
            if c == "{":
                close = pattern.find("}", i)
                if close < 0:
                    return None
                i = close + 1
            else:
                i += 1
        elif c == "+" or c in ".^$":
            i += 1
        else:
            literal = c
            i += 1
        if literal is not None and depth == 0:
            run.append(literal)
            last_literal = True
            continue
        last_literal = False
        if run:
            runs.append("".join(run))
            run = []
    if depth or i > n:
        return None
    if run:
        runs.append("".join(run))
    best = max(runs, key=len, default="")
    return best or None


def _find(hay: AnyStr, needle: AnyStr, rare: AnyStr, back: int, start: int) -> int:
    """Where ``needle`` first occurs in ``hay`` at or after ``start``, or -1.

    ``rare = needle[back]`` is found first (a memchr for one byte or one
    Latin-1 character); only when it keeps turning up does the full
    substring search run.
    """
    hit = hay.find(rare, start + back)
    for _ in range(_RARE_HITS):
        if hit < 0:
            return -1
        if hay.startswith(needle, hit - back):
            return hit - back
        hit = hay.find(rare, hit + 1)
    return -1 if hit < 0 else hay.find(needle, hit - back)


def single_line(pattern: str) -> bool:
    """Whether no match of ``pattern`` can hold a newline (judged conservatively).

    Allowed: literal characters other than newline, ``.`` (no DOTALL: inline
    flags are refused before this is asked), escaped punctuation, the
    escapes below, counted repeats, and classes that neither negate nor hold
    a character at or below U+000A (so no range can reach the newline).
    """
    i = 0
    n = len(pattern)
    in_class = False
    while i < n:
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1 : i + 2]
            ok = _SAFE_CLASS_ESCAPES if in_class else _SAFE_ESCAPES
            if not (nxt in ok or (nxt and nxt in string.punctuation)):
                return False
            i += 2
            continue
        if in_class:
            if ord(c) <= _NEWLINE or c == "[":  # [[:space:]] holds the newline
                return False
            in_class = c != "]" or pattern[i - 1] in "[^"
        elif c == "[":
            if pattern[i + 1 : i + 2] == "^":
                return False
            in_class = True
        elif c == "{":
            close = pattern.find("}", i)
            if close < 0 or not _COUNTED.fullmatch(pattern, i, close + 1):
                return False
            i = close
        elif c == "\n":
            return False
        i += 1
    return not in_class


def _rarest(ranks: list[int]) -> int:
    return ranks.index(max(ranks))


class Prefilter:
    """A literal every match contains, tested before any regex search.

    A character of the text decoded with ``errors="replace"`` that is not
    U+FFFD comes from its own UTF-8 bytes, so a literal without U+FFFD that
    is absent from the bytes is absent from the decoded text too.
    """

    def __init__(self, literal: str, *, single_line: bool) -> None:
        self.text = literal
        self.single_line = single_line
        self.data = literal.encode("utf-8")
        unlisted = len(_COMMON_BYTES)
        ranks = [r if r >= 0 else unlisted for r in map(_COMMON_BYTES.find, self.data)]
        self.data_back = _rarest(ranks)
        self.data_rare = self.data[self.data_back : self.data_back + 1]
        ranks = [_COMMON_BYTES.find(ord(c)) if c.isascii() else unlisted for c in literal]
        self.text_back = _rarest([r if r >= 0 else unlisted for r in ranks])
        self.text_rare = literal[self.text_back]

    @classmethod
    def for_pattern(cls, pattern: str) -> Prefilter | None:
        literal = required_literal(pattern)
        if literal is None or "\ufffd" in literal:
            return None
        try:
            return cls(literal, single_line=single_line(pattern))
        except UnicodeEncodeError:  # a lone surrogate
            return None

    def in_data(self, data: bytes) -> bool:
        """False only when ``data``, decoded, cannot hold a match."""
        return _find(data, self.data, self.data_rare, self.data_back, 0) >= 0

    def next_start(self, text: str, pos: int) -> int:
        """A line start at or after ``pos`` before which no match starts, or -1 for none.

        A match starting at or after ``pos`` holds the literal at or after
        ``pos``; a match that cannot span lines also starts on that line.
        """
        at = _find(text, self.text, self.text_rare, self.text_back, pos)
        if at < 0 or not self.single_line:
            return at if at < 0 else pos
        return text.rfind("\n", pos, at) + 1 or pos
