"""Hypothesis strategies: file trees, agent paths, hostile paths and junk payloads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

__all__ = [
    "GLOBS",
    "GREP_PATTERNS",
    "NAMES",
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

_text = st.text(alphabet="ab x\né", max_size=24)
_binary = st.text(alphabet="ab\x00", min_size=1, max_size=6).map(lambda t: t + "\x00")
contents = st.one_of(_text, _text, _text, _binary).map(lambda t: t.encode("utf-8"))
"""Small UTF-8 file contents; one in four holds NUL (binary to grep)."""


@st.composite
def paths(draw: st.DrawFn, names: Sequence[str] = NAMES, max_depth: int = 3) -> str:
    """Agent paths over ``names``, spelled in every legal way (``/a``, ``a``, ``./a//b``)."""
    comps = draw(st.lists(st.sampled_from(names), min_size=0, max_size=max_depth))
    return _spell(draw, comps)


DIR_NAMES = ("d", "é")
FILE_NAMES = ("a", "b.txt", "c.py")


@st.composite
def tree_paths(draw: st.DrawFn, *, leaf: bool) -> str:
    """Paths in a small tree: directories ``d``/``é``, files ``a``/``b.txt``/``c.py``.

    ``leaf=True`` ends in a file name, otherwise in a directory (or the root).
    One path in ten puts a file name where a directory should be.
    """
    comps = draw(st.lists(st.sampled_from(DIR_NAMES), max_size=2))
    if draw(st.integers(0, 9)) == 0:
        comps.insert(draw(st.integers(0, len(comps))), draw(st.sampled_from(FILE_NAMES)))
    if leaf:
        comps.append(draw(st.sampled_from(FILE_NAMES)))
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
