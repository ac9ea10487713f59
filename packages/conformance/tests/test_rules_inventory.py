"""The rule inventory stays whole: no sentence without a test, no test without a sentence."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral_conformance import _suites
from corral_conformance._rules import AREAS, MARKER, RULES, define, rule

RULES_MD = Path(__file__).resolve().parents[1] / "RULES.md"


def _abstract_tests() -> Iterator[tuple[str, str, tuple[str, ...]]]:
    """(class, test name, rule ids) of every test in the Abstract*Tests classes."""
    for cls_name in _suites.__all__:
        cls = getattr(_suites, cls_name)
        if cls_name == "AbstractProviderTests":
            continue  # the union; its tests are listed under their own classes
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("test_"):
                continue
            ids: list[str] = []
            for mark in getattr(fn, "pytestmark", []):
                if mark.name == MARKER:
                    ids += [str(a) for a in mark.args]
            yield cls_name, name, tuple(ids)


def test_every_test_carries_a_rule() -> None:
    bare = [f"{cls}.{name}" for cls, name, ids in _abstract_tests() if not ids]
    assert not bare, f"tests without @rule(...): {bare}"


def test_every_rule_is_checked_by_a_test() -> None:
    used = {rid for _, _, ids in _abstract_tests() for rid in ids}
    unused = sorted(set(RULES) - used - {r for r in RULES if r.endswith("demo_report")})
    assert not unused, f"rules no test checks: {unused}"
    unknown = sorted(used - set(RULES))
    assert not unknown, f"tests carry undefined rule ids: {unknown}"


def test_every_rule_is_in_the_inventory() -> None:
    text = RULES_MD.read_text(encoding="utf-8")
    listed = set(re.findall(r"`([a-z]+(?:\.[a-z0-9_]+)+)`", text))
    missing = sorted(rid for rid in RULES if rid not in listed and not rid.endswith("demo_report"))
    assert not missing, f"rule ids missing from RULES.md: {missing}"
    for area in AREAS:
        assert re.search(rf"^## {area}\b", text, re.MULTILINE), f"RULES.md lacks a {area} section"


def test_inventory_names_real_tests() -> None:
    """Each test RULES.md names exists and carries the rule of its row."""
    tests = {name: ids for _, name, ids in _abstract_tests()}
    text = RULES_MD.read_text(encoding="utf-8")
    for line in text.splitlines():
        if not line.startswith("|") or "`" not in line:
            continue
        ids = set(re.findall(r"`([a-z]+(?:\.[a-z0-9_]+)+)`", line))
        for name in re.findall(r"`(test_[a-z0-9_]+)`", line):
            assert name in tests, f"RULES.md names {name}, which is not a suite test"
            assert ids & set(tests[name]), f"{name} does not carry {sorted(ids)} as RULES.md says"


def test_define_and_rule_refuse_mistakes() -> None:
    with pytest.raises(ValueError, match="dotted"):
        define("nodots", "s", "x")
    with pytest.raises(ValueError, match="dotted"):
        define("bogus.area", "s", "x")
    with pytest.raises(ValueError, match="undefined"):
        rule("refs.never_defined_anywhere")
    with pytest.raises(ValueError, match="at least one"):
        rule()
    rid = define("refs.inventory_selftest", "s", "one  sentence")
    assert define("refs.inventory_selftest", "s", "one sentence") == rid
    with pytest.raises(ValueError, match="twice"):
        define("refs.inventory_selftest", "s", "another sentence")
    del RULES[rid]
