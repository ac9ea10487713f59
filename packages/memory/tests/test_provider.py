"""The provider contract: open, resolve, refs, versions, isolation, close, plugin."""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import corral
import corral.provider
import corral_memory
from corral_memory import InMemoryProvider

pytestmark = pytest.mark.anyio

FS = corral.provider.FileSystem


async def _failure(awaitable: object) -> corral.WorkspaceFailedError:
    with pytest.raises(corral.WorkspaceFailedError) as info:
        await awaitable  # type: ignore[misc]
    assert info.value.provider_id == "in-memory"
    assert not info.value.transient
    return info.value


def _fs(ws: corral.provider.Workspace) -> corral.provider.FileSystem:
    assert ws.fs is not None
    return ws.fs


async def test_provider_shape(provider: InMemoryProvider, anyio_backend: str) -> None:
    assert isinstance(provider, corral.provider.WorkspaceProvider)
    assert provider.provider_id == "in-memory"
    assert provider.capabilities == frozenset({"fs", "snapshot"})
    assert provider.schema_version == 2


async def test_open_builds_everything_and_stamps_the_ref(
    opened: corral.provider.OpenedWorkspace,
) -> None:
    ws, ref = opened.workspace, opened.ref
    assert isinstance(ws, corral.provider.Workspace)
    assert isinstance(ws.fs, corral.provider.FileSystem)
    assert isinstance(ws.snapshot, corral.provider.Snapshotter)
    assert ws.shell is None
    assert ws.code is None
    assert ref.provider_id == "in-memory"
    assert ref.schema_version == 2
    assert ref.capabilities == frozenset({"fs", "snapshot"})
    assert set(ref.payload) == {"workspace_id", "process_token"}
    assert ws.id == f"in-memory:{ref.payload['workspace_id']}"
    json.dumps(corral.ref_to_dict(ref))


@pytest.mark.parametrize(
    ("declared", "built"),
    [
        (frozenset({"fs"}), {"fs"}),
        (frozenset({"fs", "snapshot"}), {"fs", "snapshot"}),
        (frozenset({"snapshot"}), {"fs", "snapshot"}),
        (frozenset(), {"fs"}),
    ],
)
async def test_open_honours_declared(
    provider: InMemoryProvider,
    config: corral.ProviderConfig,
    session: corral.SessionRef,
    declared: frozenset[str],
    built: set[str],
    anyio_backend: str,
) -> None:
    opened = await provider.open(config, session, declared)
    assert opened.ref.capabilities == built
    assert (opened.workspace.snapshot is not None) == ("snapshot" in built)
    resolved = await provider.resolve(opened.ref)
    assert (resolved.snapshot is not None) == ("snapshot" in built)
    await opened.workspace.close()


async def test_open_refuses_unsupported_capability(
    provider: InMemoryProvider,
    config: corral.ProviderConfig,
    session: corral.SessionRef,
    anyio_backend: str,
) -> None:
    err = await _failure(provider.open(config, session, frozenset({"fs", "shell", "code"})))
    assert "code, shell" in err.message


async def test_open_refuses_per_session_options(
    provider: InMemoryProvider, session: corral.SessionRef, anyio_backend: str
) -> None:
    cfg = corral.ProviderConfig(kind="in-memory", options={"max_file_bytes": 1})
    err = await _failure(provider.open(cfg, session))
    assert "no per-session options" in err.message


async def test_sessions_on_one_provider_are_isolated(
    provider: InMemoryProvider, config: corral.ProviderConfig, anyio_backend: str
) -> None:
    a = await provider.open(config, corral.SessionRef("a"))
    b = await provider.open(config, corral.SessionRef("a"))
    assert a.workspace.id != b.workspace.id
    await _fs(a.workspace).write_file("/secret", b"a's data")
    assert await _fs(b.workspace).ls("/") == []
    with pytest.raises(corral.OperationError):
        await _fs(b.workspace).read_file("/secret")
    await a.workspace.close()
    assert await _fs(b.workspace).ls("/") == []
    await b.workspace.close()


async def test_resolve_from_another_instance_sees_the_same_workspace(
    opened: corral.provider.OpenedWorkspace,
) -> None:
    await _fs(opened.workspace).write_file("/f", b"one")
    again = await InMemoryProvider(max_file_bytes=1).resolve(
        corral.ref_from_json(corral.ref_to_json(opened.ref))
    )
    assert again.id == opened.workspace.id
    assert await _fs(again).read_file("/f") == b"one"
    await _fs(again).write_file("/g", b"two")
    assert await _fs(opened.workspace).read_file("/g") == b"two"
    # Limits belong to the workspace, not to the resolving provider.
    await _fs(again).write_file("/h", b"longer than one byte")


async def test_resolve_after_close_fails_and_old_handles_are_closed(
    opened: corral.provider.OpenedWorkspace, provider: InMemoryProvider
) -> None:
    resolved = await provider.resolve(opened.ref)
    await resolved.close()
    err = await _failure(provider.resolve(opened.ref))
    assert "gone" in err.message
    with pytest.raises(corral.OperationError) as info:
        await _fs(opened.workspace).ls("/")
    assert info.value.code == "closed"


async def test_concurrent_close_is_safe(opened: corral.provider.OpenedWorkspace) -> None:
    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(opened.workspace.close)
    assert getattr(opened.workspace, "closed", None) is True


@pytest.mark.parametrize("version", [None, 1, 2])
async def test_supported_schema_versions(
    opened: corral.provider.OpenedWorkspace, version: int | None
) -> None:
    ref = attrs.evolve(opened.ref, schema_version=version)
    ws = await InMemoryProvider().resolve(ref)
    assert ws.id == opened.workspace.id


@pytest.mark.parametrize("version", [0, 3, -1, 10**9])
async def test_unsupported_schema_versions(
    opened: corral.provider.OpenedWorkspace, version: int
) -> None:
    err = await _failure(
        InMemoryProvider().resolve(attrs.evolve(opened.ref, schema_version=version))
    )
    assert "None, 1, 2" in err.message


async def test_foreign_ref_refused(opened: corral.provider.OpenedWorkspace) -> None:
    err = await _failure(InMemoryProvider().resolve(attrs.evolve(opened.ref, provider_id="docker")))
    assert "another provider" in err.message


async def test_ref_claiming_other_capabilities_refused(
    opened: corral.provider.OpenedWorkspace,
) -> None:
    ref = attrs.evolve(opened.ref, capabilities=frozenset({"fs", "shell"}))  # type: ignore[arg-type]
    err = await _failure(InMemoryProvider().resolve(ref))
    assert "shell" not in err.message


async def test_not_a_ref_refused(provider: InMemoryProvider, anyio_backend: str) -> None:
    await _failure(provider.resolve({"provider_id": "in-memory"}))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [
        {"workspace_id": None},
        {"process_token": None},
        {"extra": "x"},
        {"workspace_id": 7},
        {"workspace_id": "mem-" + "G" * 32},
        {"workspace_id": "../../etc/passwd"},
        {"process_token": "abc"},
        {"process_token": ["a"]},
    ],
)
async def test_malformed_payloads(
    opened: corral.provider.OpenedWorkspace, change: dict[str, Any]
) -> None:
    payload = dict(opened.ref.payload)
    for key, value in change.items():
        if value is None:
            payload.pop(key)
        else:
            payload[key] = value
    err = await _failure(InMemoryProvider().resolve(attrs.evolve(opened.ref, payload=payload)))
    assert err.message == "workspace ref payload is malformed"


async def test_ref_from_another_process_is_lost(opened: corral.provider.OpenedWorkspace) -> None:
    payload = dict(opened.ref.payload, process_token="0" * 32)
    err = await _failure(InMemoryProvider().resolve(attrs.evolve(opened.ref, payload=payload)))
    assert "lost" in err.message
    assert "restart" in err.message


@pytest.mark.slow
async def test_ref_made_by_an_exited_process_is_reported_lost(anyio_backend: str) -> None:
    script = (
        "import anyio, corral\n"
        "from corral_memory import InMemoryProvider\n"
        "async def main():\n"
        "    o = await InMemoryProvider().open(corral.ProviderConfig(kind='in-memory'),"
        " corral.SessionRef('x'))\n"
        "    await o.workspace.fs.write_file('/f', b'data')\n"
        "    print(corral.ref_to_json(o.ref))\n"
        "anyio.run(main)\n"
    )
    done = await anyio.run_process([sys.executable, "-c", script])
    ref = corral.ref_from_json(done.stdout)
    err = await _failure(InMemoryProvider().resolve(ref))
    assert "exited" in err.message


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(
    max_examples=75, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    payload=st.dictionaries(st.text(max_size=20), _JSON, max_size=5)
    | st.fixed_dictionaries({"workspace_id": _JSON, "process_token": _JSON}),
    version=st.none() | st.integers(),
)
def test_junk_payloads_are_rejected_without_echo(
    payload: dict[str, Any], version: int | None
) -> None:
    ref = corral.WorkspaceRef(
        provider_id="in-memory",
        payload=payload,
        capabilities=frozenset({"fs"}),  # type: ignore[arg-type]
        schema_version=version,
    )

    async def attempt(ref: corral.WorkspaceRef) -> corral.WorkspaceFailedError:
        with pytest.raises(corral.WorkspaceFailedError) as info:
            await InMemoryProvider().resolve(ref)
        return info.value

    err = anyio.run(attempt, ref)
    # Words the provider says for an empty payload too ("supports None, 1, 2")
    # are its own, not an echo of the payload.
    own = anyio.run(attempt, attrs.evolve(ref, payload={})).message
    for text in _strings(payload):
        if len(text) >= 4 and text not in own:
            assert text not in err.message


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [*_strings(k), *_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


@pytest.mark.parametrize("bad", [0, -1, True, "1", 1.5, None])
@pytest.mark.parametrize(
    "key", ["max_workspace_bytes", "max_file_bytes", "max_grep_file_bytes", "max_snapshots"]
)
def test_provider_options_are_validated(key: str, bad: object) -> None:
    with pytest.raises(corral.ConfigError) as info:
        InMemoryProvider(**{key: bad})  # type: ignore[arg-type]
    assert key in str(info.value)


def test_plugin_registers_the_provider() -> None:
    from corral_memory import _plugin

    plugins = corral.load_plugins([_plugin], entrypoints=False)
    spec = plugins.provider("in-memory")
    assert spec.capabilities == frozenset({"fs", "snapshot"})
    assert spec.distribution == "corral-memory"
    assert spec.version is not None
    made = spec.create({"max_file_bytes": 10})
    assert isinstance(made, InMemoryProvider)
    assert made.limits.max_file_bytes == 10
    with pytest.raises(corral.ConfigError):
        spec.create({"no_such_option": 1})


def test_entry_point_is_declared() -> None:
    import importlib.metadata

    (ep,) = [e for e in importlib.metadata.entry_points(group="corral") if e.name == "memory"]
    assert ep.value == "corral_memory._plugin"


def test_public_surface() -> None:
    assert sorted(corral_memory.__all__) == [
        "DEFAULT_MAX_FILE_BYTES",
        "DEFAULT_MAX_GREP_FILE_BYTES",
        "DEFAULT_MAX_SNAPSHOTS",
        "DEFAULT_MAX_WORKSPACE_BYTES",
        "ENTRY_OVERHEAD",
        "InMemoryFileSystem",
        "InMemoryProvider",
        "InMemorySnapshotter",
        "Limits",
        "PROVIDER_ID",
        "RefPayload",
        "SCHEMA_VERSION",
        "SUPPORTED_CAPABILITIES",
    ]
    for name in corral_memory.__all__:
        assert getattr(corral_memory, name) is not None


async def test_details(opened: corral.provider.OpenedWorkspace) -> None:
    await _fs(opened.workspace).write_file("/f", b"12345")
    details = corral.provider.describe_workspace(opened.workspace)
    assert details["provider_id"] == "in-memory"
    assert details["workspace_id"] == opened.workspace.id
    assert details["file_bytes"] == 5
    assert details["used_bytes"] == corral_memory.ENTRY_OVERHEAD + 1 + 5
    assert details["snapshots"] == 0
