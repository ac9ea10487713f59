"""Refs: declared capabilities, ref versions, round trips, hostile and tampered refs."""

from __future__ import annotations

import itertools
import re
import secrets
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import attrs
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import corral
import corral.provider
from corral import ConfigError, WorkspaceFailedError, WorkspaceRef
from corral.provider import OpenedWorkspace, Workspace

from ._harness import Harness, dump_tree
from ._rules import define, rule
from ._strategies import json_values, junk_payloads

__all__ = ["AbstractRefTests", "populated"]

_UNKNOWN = ("code", "script", "git", "conformance-unknown")
BUILTIN_MODULES = ("fs", "shell", "code", "script", "snapshot")

R_DECLARED = define(
    "refs.declared.populated",
    "spec/building-a-provider.txt (capabilities)",
    "Every capability declared is also on WorkspaceRef.capabilities and each declared module "
    "is non-None on the returned Workspace, at open and at resolve; a declared capability the "
    "provider cannot populate is a WorkspaceFailedError at open (or left off the ref).",
)
R_TRUTHFUL = define(
    "refs.capabilities.match_modules",
    "WorkspaceRef.capabilities (corral._data); spec 'ref.capabilities must match what you "
    "actually built'",
    "The ref's capabilities are exactly the modules open populated (for every declared set, "
    "declared=None included), and resolve of the ref populates every one of them again.",
)
R_STAMP = define(
    "refs.version.stamp",
    "corral._refs; spec (N±1 contract)",
    "Every ref produced by open() stamps provider_id and schema_version N (the provider's "
    "schema_version).",
)
R_ACCEPT = define(
    "refs.version.accept",
    "corral._refs.check_ref_schema_version",
    "resolve() accepts refs with schema_version None, N-1 and N, and they re-attach the same "
    "workspace.",
)
R_REJECT = define(
    "refs.version.reject",
    "corral._refs.check_ref_schema_version",
    "Any other schema_version (N-2, N+1, negative, huge, a bool, a float, a string, any "
    "non-int) is a WorkspaceFailedError naming the unsupported version and the supported set.",
)
R_FOREIGN = define(
    "refs.foreign",
    "WorkspaceProvider.resolve; corral._refs.check_ref",
    "A ref whose provider_id is not exactly this provider's id is refused with "
    "WorkspaceFailedError.",
)
R_ROUND_TRIP = define(
    "refs.json_round_trip",
    "WorkspaceRef.payload (corral._data); spec 'What goes in the ref payload'",
    "The payload is JSON-compatible data, never live objects; a ref survives "
    "ref_to_json/ref_from_json (and json.dumps/loads) and resolves to the same workspace id "
    "and files.",
)
R_SECRETS = define(
    "refs.no_secrets",
    "WorkspaceRef.payload (corral._data); spec 'What NOT to put in the ref'",
    "Refs never hold secrets: nothing from the config options or the session's agent reaches "
    "the ref.",
)
R_WRAPPER = define(
    "refs.malformed_wrapper",
    "WorkspaceProvider.resolve",
    "A ref whose provider_id, payload or schema_version has the wrong JSON type is refused "
    "with WorkspaceFailedError, and any capability set is refused or ignored, never another "
    "exception.",
)
R_JUNK = define(
    "refs.malformed_payload",
    "WorkspaceProvider.resolve; corral._refs.structure_payload",
    "A malformed payload (junk, unknown keys, any field of the wrong JSON type, at any depth) "
    "is a WorkspaceFailedError whose message does not repeat the input.",
)
R_TAMPERED = define(
    "refs.tampered_payload",
    "WorkspaceProvider.resolve (the ref is untrusted)",
    "A payload whose values were changed either resolves to the very workspace it was made "
    "from (same files) or is a WorkspaceFailedError; never another location, a host "
    "directory, or a fresh empty workspace.",
)
R_PERMANENT = define(
    "errors.resolve.permanent",
    "corral._errors.WorkspaceFailedError; spec 'Transient vs permanent errors'",
    "A foreign, malformed or unsupported-version ref is a permanent failure: "
    "WorkspaceFailedError with transient=False (retries cannot fix it), never "
    "WorkspaceEvictedError.",
)


def populated(h: Harness, ws: Workspace) -> frozenset[str]:
    """The modules a workspace really has, among the built-ins and the advertised ones."""
    names = set(BUILTIN_MODULES) | set(h.advertised) | set(_UNKNOWN)
    return frozenset(n for n in names if ws.module(n) is not None)


def _supported(current: int) -> tuple[int, ...]:
    return (current - 1, current) if current > 1 else (current,)


def check_permanent(exc: WorkspaceFailedError, what: str) -> None:
    """A refusal of a bad ref must not ask the registry to retry."""
    assert not getattr(exc, "transient", False), (
        f"{what} was refused with transient=True; retrying cannot fix a bad ref"
    )


def check_no_echo(exc: BaseException, canary: str, what: str) -> None:
    """The refusal of untrusted input must not repeat it."""
    message = f"{exc} {getattr(exc, 'message', '')}"
    assert canary not in message, f"the refusal of {what} echoes the input"


async def _first_calls(h: Harness, ws: Workspace, capabilities: frozenset[str]) -> None:
    """The first tool call on each declared built-in module must not fail."""
    if "fs" in capabilities and ws.fs is not None:
        await h.call(ws.fs.stat, "/")
    if "snapshot" in capabilities and ws.snapshot is not None:
        await h.call(ws.snapshot.list)
    if "shell" in capabilities and ws.shell is not None:
        result = await h.call(ws.shell.run, corral.provider.CommandRequest("true", timeout_s=30))
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


def _wrong_types(value: Any, canary: str) -> list[Any]:
    """Every JSON type a field holding ``value`` must refuse (None only for non-null)."""
    if isinstance(value, bool):
        return [1, 0.5, canary, [canary], {canary: canary}]
    if isinstance(value, int):
        return [True, 0.5, canary, [canary], {canary: canary}]
    if isinstance(value, float):
        return [True, canary, [canary], {canary: canary}]
    if isinstance(value, str):
        return [True, 7, 0.5, [canary], {canary: canary}]
    if isinstance(value, list | tuple):
        return [True, 7, canary, {canary: canary}]
    if isinstance(value, Mapping):
        return [True, 7, canary, [canary]]
    return [[canary], {canary: canary}]  # None: the field is optional; only containers are junk


def _set_in(payload: Mapping[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = dict(payload)
    if len(path) == 1:
        out[path[0]] = value
    else:
        out[path[0]] = _set_in(out[path[0]], path[1:], value)
    return out


def _fields(payload: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """(path, value) of every field, nested mappings included."""
    for key, value in payload.items():
        yield (*prefix, key), value
        if isinstance(value, Mapping):
            yield from _fields(value, (*prefix, key))


def _raw_ref(ref: WorkspaceRef, **fields: Any) -> WorkspaceRef:
    """A copy of ``ref`` with fields set to anything, bypassing attrs converters."""
    copy = attrs.evolve(ref)
    for name, value in fields.items():
        object.__setattr__(copy, name, value)
    return copy


class AbstractRefTests:
    """What ``open`` and ``resolve`` promise about refs."""

    @rule(R_DECLARED)
    @pytest.mark.anyio
    async def test_declared_capabilities_are_populated(self, conformance: Harness) -> None:
        """A declared module is populated at open and resolve, or open fails.

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
            resolved = await h.resolve(opened.ref)
            _check_populated(h, "resolve", resolved, opened.ref, want)
            await _first_calls(h, resolved, declared)
        finally:
            await h.call(opened.workspace.close)
            await h.release()

    @rule(R_TRUTHFUL, R_DECLARED)
    @pytest.mark.anyio
    async def test_undeclared_open_populates_its_ref(self, conformance: Harness) -> None:
        """For every declared subset and None, ref capabilities == populated modules.

        The registry trusts the ref: a module built but left off the ref
        vanishes after the next resolve (a snapshot module, say), and one on
        the ref but not built breaks the first tool call.
        """
        h = conformance
        subsets: list[frozenset[str] | None] = [None]
        adv = sorted(h.advertised)
        for size in range(len(adv) + 1):
            subsets += [frozenset(c) for c in itertools.combinations(adv, size)]
        for declared in subsets:
            where = f"open(declared={sorted(declared) if declared is not None else None})"
            opened = await h.open(declared)
            try:
                built = populated(h, opened.workspace)
                extra = opened.ref.capabilities - h.advertised
                assert not extra, f"{where}: the ref advertises {sorted(extra)}, not advertised"
                assert opened.ref.capabilities == built, (
                    f"{where}: the ref advertises {sorted(opened.ref.capabilities)} but the "
                    f"workspace populated {sorted(built)}"
                )
                if declared is not None:
                    assert declared <= built, f"{where}: declared modules are missing"
                resolved = await h.resolve(opened.ref)
                again = populated(h, resolved)
                assert built <= again, (
                    f"{where}: open populated {sorted(built)}, resolve of its ref only "
                    f"{sorted(again)}"
                )
            finally:
                await h.call(opened.workspace.close)
                await h.release()

    @rule(R_STAMP)
    @pytest.mark.anyio
    async def test_ref_stamps_current_schema_version(self, conformance: Harness) -> None:
        """Refs from open carry the provider's id and current version N."""
        h = conformance
        for declared in (h.advertised, None):
            opened = await h.open(declared)
            try:
                assert opened.ref.provider_id == h.kind, "the ref names another provider"
                assert opened.ref.schema_version == h.provider.schema_version, (
                    f"ref stamped {opened.ref.schema_version!r}, "
                    f"provider.schema_version is {h.provider.schema_version}"
                )
                assert type(opened.ref.schema_version) is int, "schema_version is not an int"
            finally:
                await h.call(opened.workspace.close)

    @rule(R_ACCEPT)
    @pytest.mark.anyio
    async def test_resolve_accepts_supported_versions(self, conformance: Harness) -> None:
        """Resolve accepts None, N-1 and N, each re-attaching the same workspace."""
        h = conformance
        current = h.provider.schema_version
        async with h.session(declared=h.advertised) as opened:
            fs = opened.workspace.fs
            if fs is not None:
                await h.call(fs.write_file, "/versioned.txt", b"v")
            refs = {current: opened.ref, None: attrs.evolve(opened.ref, schema_version=None)}
            if current > 1:
                refs[current - 1] = h.downgrade_ref(opened.ref)
            for version, ref in refs.items():
                try:
                    resolved = await h.resolve(ref)
                except WorkspaceFailedError as exc:
                    raise AssertionError(f"resolve refused a v{version} ref: {exc}") from exc
                assert resolved.id == opened.workspace.id, (
                    f"resolve of a v{version} ref gave another workspace id"
                )
                if fs is not None:
                    assert resolved.fs is not None, f"v{version} resolve lost the fs module"
                    got = await h.call(resolved.fs.read_file, "/versioned.txt")
                    assert got == b"v", f"v{version} resolve does not see the workspace's files"

    @rule(R_REJECT, R_PERMANENT)
    @pytest.mark.anyio
    async def test_resolve_rejects_unsupported_versions(self, conformance: Harness) -> None:
        """Every other version is refused, naming it and the supported set."""
        h = conformance
        current = h.provider.schema_version
        supported = _supported(current)
        canary = f"V{secrets.token_hex(4)}"
        async with h.session(declared=h.advertised) as opened:

            @h.settings()
            @given(
                st.one_of(
                    st.integers().filter(lambda v: v not in supported),
                    st.booleans(),
                    st.floats(),
                    st.just(canary),
                    json_values.filter(lambda v: v is not None and type(v) is not int),
                )
            )
            @example(current + 1)
            @example(current + 2)
            @example(current - 2)
            @example(0)
            @example(-1)
            @example(-current)
            @example(True)
            @example(False)
            @example(2**63)
            @example(-(2**63))
            @example(10**100)
            @example(float(current))
            @example(float(current - 1))
            @example(current + 0.5)
            @example(str(current))
            @example(str(current - 1))
            @example(canary)
            @example([current])
            @example({"v": current})
            def versions(version: Any) -> None:
                if type(version) is int and version in supported:
                    return
                ref = _raw_ref(opened.ref, schema_version=version)
                with pytest.raises(WorkspaceFailedError) as caught:
                    h.blocking(h.resolve, ref)
                text = str(caught.value)
                check_permanent(caught.value, f"schema_version {version!r}")
                for ok in supported:
                    assert re.search(rf"(?<![\d-]){ok}(?!\d)", text), (
                        f"rejection of version {version!r} does not name supported version "
                        f"{ok}: {text}"
                    )
                if type(version) is int and abs(version) < 10**6:
                    assert re.search(rf"(?<!\d){version}(?!\d)", text), (
                        f"rejection of version {version} does not name it: {text}"
                    )
                assert canary not in text, "the rejection echoes the version string"

            await h.in_thread(versions)

    @rule(R_ROUND_TRIP)
    @pytest.mark.anyio
    async def test_ref_json_round_trip(self, conformance: Harness) -> None:
        """The ref survives JSON and resolves to the same workspace and files."""
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
            resolved = await h.resolve(back)
            assert resolved.id == opened.workspace.id, "resolve gave another workspace id"
            if fs is not None:
                assert resolved.fs is not None, "the resolved workspace lost its fs module"
                assert await h.call(dump_tree, resolved.fs) == await h.call(dump_tree, fs), (
                    "the resolved workspace does not see the same files"
                )

    @rule(R_SECRETS)
    @pytest.mark.anyio
    async def test_ref_holds_no_secrets(self, conformance: Harness) -> None:
        """Secrets planted in options and the session never reach the ref."""
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

    @rule(R_FOREIGN, R_PERMANENT)
    @pytest.mark.anyio
    async def test_foreign_ref_rejected(self, conformance: Harness) -> None:
        """A ref made by another provider (or a near-miss spelling of this one) is refused."""
        h = conformance
        kind = h.kind
        near = {
            f"not-{kind}",
            kind.upper(),
            kind.title(),
            f"{kind} ",
            f" {kind}",
            f"{kind}-v2",
            kind[:-1],
            f"{kind}\x00",
            "",
            "reference" if kind != "reference" else "in-memory",
        } - {kind}
        async with h.session(declared=h.advertised) as opened:
            for other in sorted(near):
                foreign = attrs.evolve(opened.ref, provider_id=other)
                with pytest.raises(WorkspaceFailedError) as caught:
                    await h.resolve(foreign)
                check_permanent(caught.value, "a foreign ref")

    @rule(R_WRAPPER, R_PERMANENT)
    @pytest.mark.anyio
    async def test_malformed_ref_wrapper_rejected(self, conformance: Harness) -> None:
        """Every JSON type in every field of the WorkspaceRef wrapper is handled cleanly.

        provider_id, payload and schema_version of the wrong type are refused;
        a capability set naming too few, too many or unknown capabilities may
        be refused or ignored, never crash.
        """
        h = conformance
        canary = f"WRAP{secrets.token_hex(4)}"
        junk: list[Any] = [None, True, 0, 1.5, canary, [canary], {canary: canary}, [[1, {}]]]
        # capabilities come typed from ref_from_json (a set of strings); what is
        # left to a provider is a set naming too few, too many or unknown ones.
        caps: list[Any] = [
            frozenset(),
            frozenset({canary}),
            h.advertised | {"code", "script", canary},
        ]
        async with h.session(declared=h.advertised) as opened:
            for field in ("provider_id", "payload", "capabilities", "schema_version"):
                for value in caps if field == "capabilities" else junk:
                    if field == "payload" and isinstance(value, Mapping):
                        continue  # a dict payload is the junk-payload rule's business
                    if field == "schema_version" and value is None:
                        continue  # None is a supported version
                    ref = _raw_ref(opened.ref, **{field: value})
                    what = f"a ref with {field} of type {type(value).__name__}"
                    try:
                        await h.resolve(ref)
                    except WorkspaceFailedError as exc:
                        check_permanent(exc, what)
                        check_no_echo(exc, canary, what)
                        continue
                    except Exception as exc:
                        raise AssertionError(
                            f"{what}: resolve raised {type(exc).__name__}, not WorkspaceFailedError"
                        ) from exc
                    assert field == "capabilities", f"resolve accepted {what}"

    @rule(R_JUNK, R_PERMANENT)
    @pytest.mark.anyio
    async def test_junk_payload_rejected(self, conformance: Harness) -> None:
        """Junk payloads and wrongly typed fields are refused without echoing them."""
        h = conformance
        canary = f"JUNK{secrets.token_hex(4)}"
        async with h.session(declared=h.advertised) as opened:
            real = dict(opened.ref.payload)

            def refuse(payload: Any, what: str) -> None:
                ref = _raw_ref(opened.ref, payload=payload)
                try:
                    h.blocking(h.resolve, ref)
                except WorkspaceFailedError as exc:
                    message = f"{exc} {getattr(exc, 'message', '')}"
                    assert canary not in message, f"the rejection of {what} echoes the payload"
                    check_permanent(exc, what)
                    return
                except Exception as exc:
                    raise AssertionError(
                        f"{what}: resolve raised {type(exc).__name__}, not WorkspaceFailedError"
                    ) from exc
                raise AssertionError(f"resolve accepted {what}")

            def every_field() -> None:
                for path, value in _fields(real):
                    for bad in _wrong_types(value, canary):
                        shown = ".".join(path)
                        refuse(
                            _set_in(real, path, bad),
                            f"a payload with {shown} as {type(bad).__name__}",
                        )
                for path, value in _fields(real):
                    if isinstance(value, Mapping):
                        refuse(_set_in(real, path, {**value, canary: 1}), "an unknown nested key")
                refuse({}, "an empty payload")

            await h.in_thread(every_field)

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
                refuse(payload, "a junk payload")

            await h.in_thread(payloads)

    @rule(R_TAMPERED)
    @pytest.mark.anyio
    async def test_tampered_payload_never_reaches_elsewhere(self, conformance: Harness) -> None:
        """Changed payload values resolve to the same workspace or fail, never elsewhere."""
        h = conformance
        h.require("fs")
        async with h.session(declared=h.advertised) as opened:
            fs = opened.workspace.fs
            assert fs is not None
            await h.call(fs.write_file, "/mine.txt", b"mine")
            want = await h.call(dump_tree, fs)
            real = dict(opened.ref.payload)
            with tempfile.TemporaryDirectory(prefix="corral-tamper-") as tmp:
                await anyio.to_thread.run_sync(
                    Path(tmp, "CANARY-tamper.txt").write_bytes, b"host file"
                )
                swaps: list[tuple[tuple[str, ...], Any]] = []
                for path, value in _fields(real):
                    if isinstance(value, str):
                        for new in (tmp, "/", "", "..", f"../{Path(tmp).name}", value + "x"):
                            swaps.append((path, new))
                        if value:
                            swaps.append((path, _same_shape(value)))
                    elif isinstance(value, int) and not isinstance(value, bool):
                        swaps += [(path, value + 1), (path, 0), (path, -1)]
                for path, new in swaps:
                    if new == _get(real, path):
                        continue
                    ref = attrs.evolve(opened.ref, payload=_set_in(real, path, new))
                    shown = ".".join(path)
                    try:
                        other = await h.resolve(ref)
                    except WorkspaceFailedError:
                        continue
                    assert other.fs is not None, f"payload {shown} changed: fs module lost"
                    seen = await h.call(dump_tree, other.fs)
                    assert seen == want, (
                        f"a ref with payload field {shown} changed resolved to a workspace with "
                        f"other files ({sorted(seen)[:5]}), not refused and not the original"
                    )


def _get(payload: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = payload
    for key in path:
        value = value[key]
    return value


def _same_shape(value: str) -> str:
    """Another value spelled like ``value`` (hex digits rotated, the rest kept): another id."""
    out = []
    for ch in value:
        if ch in "0123456789abcdef":
            out.append("0123456789abcdef"[("0123456789abcdef".index(ch) + 7) % 16])
        else:
            out.append(ch)
    return "".join(out)
