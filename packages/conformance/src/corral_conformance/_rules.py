"""The rule registry: every conformance test names the contract sentences it checks.

A *rule* is one normative sentence of the contract (``corral._protocols``,
``corral._data``, ``corral._refs``, ``corral._errors``, the core README, the
provider guide), given a dotted id grouped by area (``refs.*``,
``sessions.*``, ``lifecycle.*``, ``errors.*``, ``fs.*``, ``shell.*``,
``snapshot.*``, ``script.*``, ``process.*``). Test modules register their rules at import time with
:func:`define` and tag each test with :func:`rule`; the report then names,
for every failure, the sentences the provider broke, and
``packages/conformance/RULES.md`` maps each sentence to its tests.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final, TypeVar

import attrs
import pytest

__all__ = ["AREAS", "MARKER", "RULES", "Rule", "define", "rule", "rules_of"]

MARKER: Final = "corral_rule"
"""The pytest marker :func:`rule` attaches; its args are the rule ids."""

AREAS: Final = (
    "refs",
    "sessions",
    "lifecycle",
    "errors",
    "fs",
    "shell",
    "snapshot",
    "script",
    "code",
    "process",
)
"""The first component every rule id must have."""

_ID = re.compile(r"^[a-z]+(\.[a-z0-9_]+)+$")

F = TypeVar("F", bound=Callable[..., object])


@attrs.frozen
class Rule:
    """One normative sentence of the contract and where it is written.

    Attributes:
        id: Dotted id, area first (``refs.version.reject_others``).
        source: Where the sentence lives (``corral._refs``,
            ``FileSystem.read_file``, ``spec/building-a-provider.txt``...).
        sentence: The sentence, quoted or closely paraphrased.
    """

    id: str
    source: str
    sentence: str


RULES: dict[str, Rule] = {}
"""Every defined rule, by id (filled as the test modules are imported)."""


def define(id: str, source: str, sentence: str) -> str:
    """Register a rule and return its id, for use in :func:`rule`.

    Defining the same id twice with the same text is allowed (modules may be
    imported more than once under pytest); with different text it is a bug.

    Raises:
        ValueError: The id is malformed, its area unknown, or it was already
            defined with another source or sentence.
    """
    if not _ID.match(id) or id.split(".", 1)[0] not in AREAS:
        raise ValueError(f"rule id {id!r} must be dotted and start with one of {AREAS}")
    new = Rule(id, source, " ".join(sentence.split()))
    old = RULES.get(id)
    if old is not None and old != new:
        raise ValueError(f"rule {id!r} is defined twice with different text")
    RULES[id] = new
    return id


def rule(*ids: str) -> Callable[[F], F]:
    """Tag a test with the rules it checks (``pytest.mark.corral_rule(*ids)``).

    Raises:
        ValueError: No id given, or an id was not defined first (a typo would
            otherwise silently detach the test from its sentence).
    """
    if not ids:
        raise ValueError("rule() needs at least one rule id")
    unknown = [i for i in ids if i not in RULES]
    if unknown:
        raise ValueError(f"undefined rule ids: {unknown}; define() them first")
    mark = getattr(pytest.mark, MARKER)(*ids)

    def attach(fn: F) -> F:
        return mark(fn)  # type: ignore[no-any-return]

    return attach


def rules_of(item: pytest.Item) -> tuple[str, ...]:
    """The rule ids a collected test carries, in order, without duplicates."""
    seen: dict[str, None] = {}
    for mark in item.iter_markers(MARKER):
        for rid in mark.args:
            seen.setdefault(str(rid), None)
    return tuple(seen)
