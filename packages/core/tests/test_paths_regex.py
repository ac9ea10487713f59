"""Agent-view paths, glob matching and the regex engines."""

from __future__ import annotations

import fnmatch
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import corral
import corral._regex
import corral.provider
from corral import OperationError

segments = st.text(alphabet="ab.-_", min_size=1, max_size=4)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a.txt", "/a.txt"),
        ("/a.txt", "/a.txt"),
        ("//a///b/", "/a/b"),
        ("./a/./b", "/a/b"),
        ("a/b/../c", "/a/c"),
        ("", "/"),
        ("/", "/"),
        ("/ünï/çødé", "/ünï/çødé"),
    ],
)
def test_normalize_path(raw: str, expected: str) -> None:
    assert corral.provider.normalize_path(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "..",
        "/..",
        "a/../../b",
        "/a/../../etc/passwd",
        "a\x00b",
        "x" * 5000,
        "/" + "y" * 300,
        "\udc80",
    ],
)
def test_bad_paths_fail_cleanly(raw: str) -> None:
    with pytest.raises(OperationError) as info:
        corral.provider.normalize_path(raw)
    assert info.value.code == "invalid_path"


@given(st.lists(st.sampled_from(["a", "b", "..", ".", ""]), max_size=8))
@settings(max_examples=200, deadline=None)
def test_normalised_paths_never_climb(parts: list[str]) -> None:
    raw = "/".join(parts)
    depth = 0
    climbs = False
    for part in parts:
        if part == "..":
            depth -= 1
            climbs = climbs or depth < 0
        elif part not in ("", "."):
            depth += 1
    if climbs:
        with pytest.raises(OperationError, match="escapes"):
            corral.provider.normalize_path(raw)
        return
    path = corral.provider.normalize_path(raw)
    assert path.startswith("/")
    assert ".." not in path.split("/")
    assert corral.provider.normalize_path(path) == path


@given(
    st.lists(segments, min_size=1, max_size=3), st.sampled_from(["*", "?", "a*", "*.b", "[ab]*"])
)
@settings(max_examples=200, deadline=None)
def test_single_component_glob_agrees_with_fnmatch(parts: list[str], pattern: str) -> None:
    name = parts[0]
    assert corral.provider.glob_match(pattern, name) == fnmatch.fnmatchcase(name, pattern)


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("**/*.py", "a.py", True),
        ("**/*.py", "x/y/a.py", True),
        ("*.py", "x/a.py", False),
        ("x/**", "x/y/z", True),
        ("x/**/z", "x/z", True),
        ("x/**/z", "x/a/b/z", True),
        ("x/*/z", "x/a/b/z", False),
        ("[!a]*", "b1", True),
        ("[!a]*", "a1", False),
    ],
)
def test_glob_semantics(pattern: str, path: str, expected: bool) -> None:
    assert corral.provider.glob_match(pattern, path) is expected


TEXT = "alpha\nBeta beta\r\ngamma\n\ndelta beta"


@pytest.mark.parametrize(
    "engine", [corral.RegexModuleEngine(), corral.Re2Engine()], ids=["regex", "re2"]
)
def test_engines_report_lines(engine: corral.RegexEngine) -> None:
    assert engine.compile("beta").search_lines(TEXT, 10) == [(2, "Beta beta"), (5, "delta beta")]
    assert engine.compile("BETA", ignore_case=True).search_lines(TEXT, 1) == [(2, "Beta beta")]
    assert engine.compile("^$").search_lines(TEXT, 10) == [(4, "")]
    assert engine.compile("zzz").search_lines(TEXT, 10) == []


def test_catastrophic_patterns_are_refused_by_default() -> None:
    for pattern in ["(a+)+$", "(a|aa)*b", "^(a|aa)+$", r"(\w+\s?)*$", r"(x)\1"]:
        assert corral._regex.looks_catastrophic(pattern)
        with pytest.raises(OperationError) as info:
            corral.RegexModuleEngine().compile(pattern)
        assert info.value.code == "invalid_argument"
    for pattern in ["a+b", "foo|bar", r"\d{3}-\d{4}", "(ab)+"]:
        assert not corral._regex.looks_catastrophic(pattern)


def test_timeout_stops_a_backtracking_search() -> None:
    engine = corral.RegexModuleEngine(timeout_s=0.2, refuse_catastrophic=False)
    # One of the shapes the regex module does not defuse by itself.
    matcher = engine.compile("^(a|aa)+$")
    started = time.monotonic()
    with pytest.raises(OperationError) as info:
        matcher.search_lines("ok\n" + "a" * 40 + "b\n", 10)
    assert info.value.code == "timeout"
    assert time.monotonic() - started < 5


def test_re2_runs_what_the_heuristic_refuses_in_linear_time() -> None:
    matcher = corral.Re2Engine().compile("^(a|aa)+$")
    assert matcher.search_lines("a" * 10000 + "b", 10) == []


def test_invalid_patterns_are_clean_errors() -> None:
    for engine in (corral.RegexModuleEngine(), corral.Re2Engine()):
        with pytest.raises(OperationError) as info:
            engine.compile("(unclosed")
        assert info.value.code == "invalid_argument"
    with pytest.raises(ValueError, match="unknown regex engine"):
        corral.get_regex_engine("pcre")


def test_apply_edit_semantics() -> None:
    data, count = corral.provider.apply_edit(b"a b a", "a", "x", replace_all=True, where="/f")
    assert (data, count) == (b"x b x", 2)
    data, count = corral.provider.apply_edit(b"a b", "b", "c", replace_all=False, where="/f")
    assert (data, count) == (b"a c", 1)
    cases = [
        (b"a a", "a", "x", False, "not_unique"),
        (b"a", "z", "x", False, "no_match"),
        (b"a", "", "x", False, "invalid_argument"),
        (b"\xff\xfe", "a", "x", False, "unsupported_file_type"),
        (b"a", "a", "\ud800", False, "invalid_argument"),
    ]
    for raw, old, new, every, code in cases:
        with pytest.raises(OperationError) as info:
            corral.provider.apply_edit(raw, old, new, replace_all=every, where="/f")
        assert info.value.code == code
