"""Refs: JSON round trip, hostile input, the N±1 version rule, payload validation."""

from __future__ import annotations

import json
import logging
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import corral
import corral.provider
from corral import WorkspaceFailedError, WorkspaceRef

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(
    payload=st.dictionaries(st.text(max_size=10), json_values, max_size=5),
    caps=st.frozensets(st.sampled_from(["fs", "shell", "snapshot", "git"])),
    version=st.none() | st.integers(min_value=-5, max_value=10),
)
@settings(max_examples=100, deadline=None)
def test_ref_json_round_trip(
    payload: dict[str, Any], caps: frozenset[str], version: int | None
) -> None:
    ref = WorkspaceRef("p", payload, caps, version)
    assert corral.ref_from_json(corral.ref_to_json(ref)) == ref


JUNK = "<<JUNK-7f3a>>"


@pytest.mark.parametrize(
    "data",
    [
        f'"{JUNK}"',
        f'{{"provider_id": 5, "payload": "{JUNK}"}}',
        f'{{"provider_id": "p", "payload": "{JUNK}"}}',
        f'{{"provider_id": "p", "capabilities": "{JUNK}"}}',
        f'{{"provider_id": "p", "schema_version": "{JUNK}"}}',
        '{"provider_id": "p", "schema_version": true}',
        f'{{"provider_id": "p", "{JUNK}": 1}}',
        f"not json {JUNK}",
        "[" * 100000,
    ],
)
def test_malformed_refs_are_rejected_without_echo(data: str) -> None:
    with pytest.raises(WorkspaceFailedError) as info:
        corral.ref_from_json(data)
    assert JUNK not in str(info.value)


@given(st.integers().filter(lambda v: v not in (1, 2)))
@settings(max_examples=100, deadline=None)
def test_schema_versions_outside_n_minus_one_are_rejected(version: int) -> None:
    with pytest.raises(WorkspaceFailedError, match=r"supports None, 1, 2"):
        corral.provider.check_ref_schema_version(version, provider_id="p", current=2)


def test_supported_versions_pass_and_migration_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        for version in (None, 1, 2):
            corral.provider.check_ref_schema_version(version, provider_id="p", current=2)
    assert "migrating ref from v1 to v2" in caplog.text


def test_foreign_ref_is_refused() -> None:
    with pytest.raises(WorkspaceFailedError, match="another provider"):
        corral.provider.check_ref(WorkspaceRef("other", {}, set(), 2), provider_id="p", current=2)


@attrs.frozen
class Payload:
    directory: str
    size: int
    tags: tuple[str, ...] = ()


def test_structure_payload_is_strict() -> None:
    ok = corral.provider.structure_payload({"directory": "d", "size": 3}, Payload, provider_id="p")
    assert ok == Payload("d", 3)
    for bad in (
        {"directory": "d", "size": "3"},
        {"directory": "d", "size": True},
        {"directory": "d", "size": 3, "extra": JUNK},
        {"size": 3},
        [JUNK],
    ):
        with pytest.raises(WorkspaceFailedError) as info:
            corral.provider.structure_payload(bad, Payload, provider_id="p")
        assert JUNK not in str(info.value)
    assert json.loads(json.dumps(corral.provider.unstructure_payload(ok))) == {
        "directory": "d",
        "size": 3,
        "tags": [],
    }
