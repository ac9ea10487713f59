"""Every option of every built-in capability policy is checked strictly for its type.

The wrong values are derived from each field's declared type, so a field
added later is covered without touching this file.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import attrs
import pytest

import corral
import corral.capability
from corral._builtin_capabilities import BUILTIN_CAPABILITIES
from corral._policies import OptionTypeError, structure_option


def _wrong_values(tp: Any) -> list[object]:
    """JSON values that do not fit ``tp`` (strings for lists, bools for numbers...)."""
    candidates: list[object] = [
        "ls",
        "",
        "true",
        "1",
        True,
        False,
        1,
        0,
        2.5,
        -1,
        math.nan,
        math.inf,
        None,
        ["x", 1],
        [],
        {"a": 1},
        {},
    ]
    return [c for c in candidates if not _fits(c, tp)]


def _fits(value: object, tp: Any) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, __import__("types").UnionType):
        return any(_fits(value, a) for a in args)
    if tp is type(None):
        return value is None
    if origin is Literal:
        return any(type(value) is type(a) and value == a for a in args)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return type(value) is int
    if tp is float:
        return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]
    if tp is str:
        return isinstance(value, str)
    if origin is tuple:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if origin in (dict, Mapping):
        return isinstance(value, dict) and all(
            _fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items()
        )
    raise AssertionError(f"policy field type {tp!r} is not covered by this test")


def _fields() -> Iterator[tuple[corral.capability.Capability[Any, Any], attrs.Attribute[Any]]]:
    for cap in BUILTIN_CAPABILITIES:
        yield from ((cap, f) for f in attrs.fields(attrs.resolve_types(cap.policy_type)))


CASES = [
    pytest.param(cap, field.name, value, id=f"{cap.name}.{field.name}={value!r}")
    for cap, field in _fields()
    for value in _wrong_values(field.type)
]


@pytest.mark.parametrize(("cap", "key", "value"), CASES)
def test_a_wrong_type_is_an_error_naming_the_key(
    cap: corral.capability.Capability[Any, Any], key: str, value: object
) -> None:
    with pytest.raises(corral.ConfigError) as info:
        cap.parse_policy({key: value})
    text = str(info.value)
    assert f"capabilities.{cap.name}" in text
    assert key in text


@pytest.mark.parametrize(("cap", "key", "value"), CASES)
def test_direct_construction_refuses_the_same_values(
    cap: corral.capability.Capability[Any, Any], key: str, value: object
) -> None:
    policy_type = cap.policy_type
    with pytest.raises((TypeError, ValueError)):
        policy_type(**{key: value})


def test_allowed_commands_as_a_string_is_not_iterated() -> None:
    shell = next(c for c in BUILTIN_CAPABILITIES if c.name == "shell")
    with pytest.raises(corral.ConfigError, match=r"capabilities\.shell\.allowed_commands"):
        shell.parse_policy({"allowed_commands": "ls"})
    with pytest.raises(TypeError, match="allowed_commands"):
        corral.ShellPolicy(allowed_commands="ls")


@pytest.mark.parametrize("cap", BUILTIN_CAPABILITIES, ids=lambda c: c.name)
def test_unknown_keys_are_refused_with_the_known_ones(
    cap: corral.capability.Capability[Any, Any],
) -> None:
    with pytest.raises(corral.ConfigError, match=r"unknown option 'nope' \(known: "):
        cap.parse_policy({"nope": 1})


def test_good_values_still_parse() -> None:
    shell = next(c for c in BUILTIN_CAPABILITIES if c.name == "shell")
    policy = shell.parse_policy(
        {"allowed_commands": ["ls", "cat"], "timeout_s": 5, "env": {"A": "b"}}
    )
    assert policy.allowed_commands == ("ls", "cat")
    assert policy.timeout_s == 5.0
    assert policy.env == {"A": "b"}
    assert shell.parse_policy({"allowed_commands": None}).allowed_commands is None


@pytest.mark.parametrize(
    ("value", "tp", "expected"),
    [
        ("ls", tuple[str, ...], "a list of strings"),
        (True, int, "an integer"),
        (1, bool, "true or false"),
        ({"a": 1}, Mapping[str, str], "an object mapping strings to strings"),
        ("x", int | None, "an integer or null"),
    ],
)
def test_structure_option_says_what_it_expected(value: object, tp: Any, expected: str) -> None:
    with pytest.raises(OptionTypeError) as info:
        structure_option(value, tp)
    assert info.value.expected == expected
