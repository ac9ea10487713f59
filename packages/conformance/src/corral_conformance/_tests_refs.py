"""Rules 2 to 5: declared capabilities, ref versions, round trips, hostile refs."""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import corral
from corral import (
    ConfigError,
    OpenedWorkspace,
    Workspace,
    WorkspaceFailedError,
    WorkspaceRef,
)

from ._harness import Harness, dump_tree
from ._strategies import json_values, junk_payloads

__all__ = ["AbstractRefTests"]

_UNKNOWN = ("code", "script", "git", "conformance-unknown")


def _supported(current: int) -> tuple[int, ...]:
    return (current - 1, current) if current > 1 else (current,)


async def _first_calls(h: Harness, ws: Workspace, capabilities: frozenset[str]) -> None:
    """The first tool call on each declared built-in module must not fail."""
    if "fs" in capabilities and ws.fs is not None:
        await h.call(ws.fs.stat, "/")
    if "snapshot" in capabilities and ws.snapshot is not None:
        await h.call(ws.snapshot.list)
    if "shell" in capabilities and ws.shell is not None:
        result = await h.call(ws.shell.run, corral.CommandRequest("true", timeout_s=30))
        assert result.exit_code == 0, f"first shell call failed: {result!r}"


def _check_populated(
    h: Harness, where: str, ws: Workspace, ref: WorkspaceRef, want: frozenset[str]
) -> None:
    missing_ref = want - ref.capabilities
    assert not missing_ref, (
        f"{where}: declared {sorted(missing_ref)} but the ref does not advertise them"
    )
    for name in ref.capabilities:
        assert ws.module(name) is not None, (
            f"{where}: the ref advertises {name!r} but the workspace has no {name!r} module"
        )


def _assert_json_only(value: Any, where: str = "payload") -> None:
    if value is None or isinstance(value, str | bool | int | float):
        return
    if isinstance(value, list | tuple):
        for idx, item in enumerate(value):
            _assert_json_only(item, f"{where}[{idx}]")
        return
    assert isinstance(value, Mapping), (
        f"ref {where} holds a live object of type {type(value).__name__}"
    )
    for key, item in value.items():
        assert isinstance(key, str), f"ref {where} has a non-string key"
        _assert_json_only(item, f"{where}.{key}")


def _wrong_type(value: Any, canary: str) -> Any:
    if isinstance(value, str):
        return {canary: [canary]}
    if isinstance(value, bool | int | float):
        return canary
    if isinstance(value, list | tuple):
        return {canary: canary}
    return [canary, 1]


class AbstractRefTests:
    """Rules 2-5: what ``open`` and ``resolve`` promise about refs."""

    @pytest.mark.anyio
    async def test_declared_capabilities_are_populated(self, conformance: Harness) -> None:
        """Rule 2: a declared module is populated at open and resolve, or open fails.

        Declared sets mix advertised capabilities with ones the provider does
        not have; for those, open may fail or return a ref that leaves them out.
        """
        h = conformance
        pool = sorted(h.advertised | set(_UNKNOWN))

        @h.settings()
        @given(st.sets(st.sampled_from(pool)))
        def declared_sets(chosen: set[str]) -> None:
            h.blocking(self._open_declared, h, frozenset(chosen))

        await h.in_thread(declared_sets)

    async def _open_declared(self, h: Harness, declared: frozenset[str]) -> None:
        try:
            opened = await h.open(declared)
        except WorkspaceFailedError:
            assert not declared <= h.advertised, (
                f"open refused {sorted(declared)}, all of which the provider advertises"
            )
            return
        # A provider may ignore what it cannot populate (the spec's strategy A) as
        # long as the ref says so truthfully: the registry then refuses the open.
        want = declared & h.advertised
        try:
            _check_populated(h, "open", opened.workspace, opened.ref, want)
            await _first_calls(h, opened.workspace, declared)
            resolved = await h.call(h.provider.resolve, opened.ref)
            _check_populated(h, "resolve", resolved, opened.ref, want)
            await _first_calls(h, resolved, declared)
        finally:
            await h.call(opened.workspace.close)

    @pytest.mark.anyio
    async def test_undeclared_open_populates_its_ref(self, conformance: Harness) -> None:
        """Rule 2: with ``declared=None`` the ref still tells the truth."""
        h = conformance
        opened = await h.open(None)
        try:
            _check_populated(h, "open(declared=None)", opened.workspace, opened.ref, frozenset())
            extra = opened.ref.capabilities - h.advertised
            assert not extra, f"the ref advertises {sorted(extra)}, which the provider does not"
        finally:
            await h.call(opened.workspace.close)

    @pytest.mark.anyio
    async def test_ref_stamps_current_schema_version(self, conformance: Harness) -> None:
        """Rule 3: refs from open carry the provider's current version N."""
        h = conformance
        async with h.session(declared=h.advertised) as opened:
            assert opened.ref.provider_id == h.kind, "the ref names another provider"
            assert opened.ref.schema_version == h.provider.schema_version, (
                f"ref stamped {opened.ref.schema_version!r}, "
                f"provider.schema_version is {h.provider.schema_version}"
            )

    @pytest.mark.anyio
    async def test_resolve_accepts_supported_versions(self, conformance: Harness) -> None:
        """Rule 3: resolve accepts None, N-1 and N."""
        h = conformance
        current = h.provider.schema_version
        async with h.session(declared=h.advertised) as opened:
            refs = {current: opened.ref, None: attrs.evolve(opened.ref, schema_version=None)}
            if current > 1:
                refs[current - 1] = h.downgrade_ref(opened.ref)
            for version, ref in refs.items():
                try:
                    await h.call(h.provider.resolve, ref)
                except WorkspaceFailedError as exc:
                    raise AssertionError(f"resolve refused a v{version} ref: {exc}") from exc

    @pytest.mark.anyio
    async def test_resolve_rejects_unsupported_versions(self, conformance: Harness) -> None:
        """Rule 3: every other version is refused, naming the supported set."""
        h = conformance
        current = h.provider.schema_version
        supported = _supported(current)
        async with h.session(declared=h.advertised) as opened:

            @h.settings()
            @given(st.integers().filter(lambda v: v not in supported))
            def versions(version: int) -> None:
                ref = attrs.evolve(opened.ref, schema_version=version)
                with pytest.raises(WorkspaceFailedError) as caught:
                    h.blocking(h.provider.resolve, ref)
                for ok in supported:
                    assert re.search(rf"(?<![\d-]){ok}(?!\d)", str(caught.value)), (
                        f"rejection of v{version} does not name supported version {ok}: "
                        f"{caught.value}"
                    )

            await h.in_thread(versions)

    @pytest.mark.anyio
    async def test_ref_json_round_trip(self, conformance: Harness) -> None:
        """Rule 4: the ref survives JSON and resolves to the same files."""
        h = conformance
        async with h.session(declared=h.advertised) as opened:
            _assert_json_only(dict(opened.ref.payload))
            fs = opened.workspace.fs
            if fs is not None:
                await h.call(fs.write_file, "/round/trip.txt", b"round trip\n")
                await h.call(fs.mkdir, "/round/empty")
            text = corral.ref_to_json(opened.ref)
            back = corral.ref_from_json(text)
            assert corral.ref_to_json(back) == text, "the ref changed across JSON"
            resolved = await h.call(h.provider.resolve, back)
            if fs is not None:
                assert resolved.fs is not None, "the resolved workspace lost its fs module"
                assert await h.call(dump_tree, resolved.fs) == await h.call(dump_tree, fs), (
                    "the resolved workspace does not see the same files"
                )

    @pytest.mark.anyio
    async def test_ref_holds_no_secrets(self, conformance: Harness) -> None:
        """Rule 4: secrets planted in options and the session never reach the ref."""
        h = conformance
        secret = f"sk-conformance-{secrets.token_hex(12)}"
        planted = {"api_key": secret, "token": secret, "password": secret}
        opened: OpenedWorkspace | None = None
        try:
            opened = await h.open(h.advertised, agent_id=secret, config=h.config(**planted))
        except (WorkspaceFailedError, ConfigError):
            opened = await h.open(h.advertised, agent_id=secret)  # unknown options are refused
        try:
            text = corral.ref_to_json(opened.ref)
            assert secret not in text, "a secret from the options or the session is in the ref"
            assert secret[3:] not in text, "a secret from the options or the session is in the ref"
        finally:
            await h.call(opened.workspace.close)

    @pytest.mark.anyio
    async def test_foreign_ref_rejected(self, conformance: Harness) -> None:
        """Rule 5: a ref made by another provider is refused."""
        h = conformance
        async with h.session(declared=h.advertised) as opened:
            foreign = attrs.evolve(opened.ref, provider_id=f"not-{h.kind}")
            with pytest.raises(WorkspaceFailedError):
                await h.call(h.provider.resolve, foreign)

    @pytest.mark.anyio
    async def test_junk_payload_rejected(self, conformance: Harness) -> None:
        """Rule 5: junk payloads are refused with a message that does not echo them."""
        h = conformance
        canary = f"JUNK{secrets.token_hex(4)}"
        async with h.session(declared=h.advertised) as opened:
            real = dict(opened.ref.payload)

            @h.settings()
            @given(
                st.one_of(
                    junk_payloads(canary),
                    st.sampled_from(sorted(real) or [canary]).map(
                        lambda key: {**real, key: _wrong_type(real.get(key), canary)}
                    ),
                    json_values.map(lambda v: {**real, canary: v}),
                )
            )
            def payloads(payload: dict[str, Any]) -> None:
                ref = attrs.evolve(opened.ref, payload=payload)
                with pytest.raises(WorkspaceFailedError) as caught:
                    h.blocking(h.provider.resolve, ref)
                message = f"{caught.value} {getattr(caught.value, 'message', '')}"
                assert canary not in message, f"the rejection echoes the payload: {caught.value}"

            await h.in_thread(payloads)
