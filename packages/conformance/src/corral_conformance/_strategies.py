"""Hypothesis strategies: file trees, agent paths, hostile paths and junk payloads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

__all__ = [
    "BYTES_EXAMPLES",
    "GLOBS",
    "GREP_PATTERNS",
    "LEGAL_NAMES",
    "NAMES",
    "any_bytes",
    "around",
    "contents",
    "hostile_paths",
    "json_values",
    "junk_payloads",
    "paths",
    "tree_paths",
]

NAMES = ("a", "b", "c.txt", "d.py", "é")
"""A small name pool, so operations collide often."""

GLOBS = ("*", "**", "*.txt", "a*", "**/*.txt", "?", "[ab]*", "a/*", "**/b", "*/*.py")
GREP_PATTERNS = (".", "a", "b+", "^x", "a b", "[ab]x", "é", "x$")

LEGAL_NAMES: tuple[str, ...] = (
    "a",
    "A",
    "é",
    "e\u0301",
    " ",
    " lead and trail ",
    "-n",
    "--help",
    "..foo",
    "foo.",
    "...",
    ".hidden",
    "tab\tname",
    "new\nline",
    "back\\slash",
    "quote'\"",
    "star*q?[x]",
    "$HOME",
    "~",
    "日本語",
    "\u202eevil",
    "\U0001f600",
    "x" * 255,
    "é" * 127 + "x",
)
"""File names the contract says every provider accepts: one to 255 UTF-8 bytes,
no ``/`` and no NUL, not ``.`` or ``..``. Case pairs (``a``/``A``) and NFC/NFD
pairs (``é``/``e\u0301``) are distinct names; the last two sit exactly at 255 bytes."""

BYTES_EXAMPLES: tuple[bytes, ...] = (
    b"",
    b"\x00",
    b"\xff\xfe\x00\x01",
    b"\x80",
    b"\xc3",
    b"caf\xc3\xa9\n",
    b"\r\n\r",
    b"no newline at end",
    bytes(range(256)),
)
"""Byte strings every read/write path must carry unchanged: empty, NUL,
invalid UTF-8, a truncated multi-byte sequence, CR/LF, every byte value."""

_text = st.text(alphabet="ab x\né\r", max_size=24)
_binary = st.text(alphabet="ab\x00", min_size=1, max_size=6).map(lambda t: t + "\x00")
any_bytes: st.SearchStrategy[bytes] = st.one_of(
    st.sampled_from(BYTES_EXAMPLES), st.binary(max_size=64)
)
"""Arbitrary bytes, not only UTF-8, with the awkward cases drawn often."""
contents = st.one_of(
    _text.map(lambda t: t.encode("utf-8")),
    _text.map(lambda t: t.encode("utf-8")),
    _binary.map(lambda t: t.encode("utf-8")),
    any_bytes,
)
"""Small file contents: half UTF-8 text, a quarter with NUL (binary to grep),
a quarter arbitrary bytes (invalid UTF-8 included)."""


def around(n: int, *, low: int = 0) -> list[int]:
    """The integers at and next to a boundary ``n`` (never below ``low``)."""
    return sorted({v for v in (low, low + 1, n - 1, n, n + 1) if v >= low})


@st.composite
def paths(draw: st.DrawFn, names: Sequence[str] = NAMES, max_depth: int = 3) -> str:
    """Agent paths over ``names``, spelled in every legal way (``/a``, ``a``, ``./a//b``)."""
    comps = draw(st.lists(st.sampled_from(names), min_size=0, max_size=max_depth))
    return _spell(draw, comps)


DIR_NAMES = ("d", "é")
FILE_NAMES = ("a", "b.txt", "c.py")
_EXOTIC = st.sampled_from(LEGAL_NAMES)


def _name(draw: st.DrawFn, pool: Sequence[str]) -> str:
    # Mostly a small pool, so operations collide; one in eight a legal oddity
    # (case twin, NFD spelling, 255 bytes, leading dash...).
    if draw(st.integers(0, 7)) == 0:
        return draw(_EXOTIC)
    return draw(st.sampled_from(tuple(pool)))


@st.composite
def tree_paths(draw: st.DrawFn, *, leaf: bool) -> str:
    """Paths in a small tree: directories ``d``/``é``, files ``a``/``b.txt``/``c.py``.

    ``leaf=True`` ends in a file name, otherwise in a directory (or the root).
    One path in ten puts a file name where a directory should be.
    """
    depth = draw(st.integers(0, 2))
    comps = [_name(draw, DIR_NAMES) for _ in range(depth)]
    if draw(st.integers(0, 9)) == 0:
        comps.insert(draw(st.integers(0, len(comps))), draw(st.sampled_from(FILE_NAMES)))
    if leaf:
        comps.append(_name(draw, FILE_NAMES))
    return _spell(draw, comps)


def _spell(draw: st.DrawFn, comps: list[str]) -> str:
    style = draw(st.integers(0, 5))
    if style == 0:
        return "/" + "/".join(comps)
    if style == 1:
        return "/".join(comps) or "/"
    if style == 2:
        return "./" + "//".join(comps)
    if style == 3 and comps:
        return "/".join([*comps[:-1], "x", "..", comps[-1]])
    if style == 4:
        return "/" + "/".join(comps) + "/"
    return "/".join(comps) or "."


_HOSTILE_PIECES = (
    "..",
    ".",
    "",
    "a",
    "é",
    "日本",
    "\u202e",
    "\x00",
    "x" * 300,
    "~",
    "$HOME",
    "%2e%2e",
    "\\..\\",
    "..\\..",
    " ",
    "\n",
    "etc",
    "passwd",
)


@st.composite
def hostile_paths(draw: st.DrawFn, extra: Sequence[str] = ()) -> str:
    """Paths built to escape: ``..``, absolute, repeated slashes, NUL, unicode, very long."""
    pieces = _HOSTILE_PIECES + tuple(extra)
    aim: bool = draw(st.booleans())
    if extra and aim:
        # Aim at the canaries directly: climb a few levels, then name one.
        climb = draw(st.sampled_from(("..", "/..", "a/../..", "./../..", "../../..")))
        tail = draw(st.sampled_from(("", "/", "/a", "/..")))
        return f"{climb}/{draw(st.sampled_from(tuple(extra)))}{tail}"
    comps = draw(st.lists(st.sampled_from(pieces), min_size=1, max_size=6))
    prefix = draw(st.sampled_from(("", "/", "//", "./", "../", "/../../")))
    path = prefix + "/".join(comps)
    if draw(st.integers(0, 9)) == 0:
        path = "/".join(["a"] * 2100)
    return path


json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
"""Arbitrary JSON values."""


def junk_payloads(canary: str) -> st.SearchStrategy[dict[str, Any]]:
    """Payload dicts whose every key is junk and which carry ``canary`` somewhere."""
    key = st.text(max_size=6).map(lambda k: f"{canary}{k}")
    value = st.one_of(st.just(canary), json_values, st.lists(st.just(canary), max_size=2))
    return st.dictionaries(key, value, min_size=1, max_size=4)
