"""Hostile and stale refs are refused with bare messages; supported versions resolve."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral import ref_from_json, ref_to_json
from corral.provider import ProviderConfig, SessionRef, WorkspaceFailedError, WorkspaceRef
from corral_local_bash import LocalBashProvider

CONFIG = ProviderConfig(kind="local-bash")


def _tampered(ref: WorkspaceRef, **changes: Any) -> WorkspaceRef:
    payload = dict(ref.payload)
    payload.update(changes)
    return WorkspaceRef(ref.provider_id, payload, ref.capabilities, ref.schema_version)


async def _refused(provider: LocalBashProvider, ref: WorkspaceRef) -> str:
    with pytest.raises(WorkspaceFailedError) as info:
        await provider.resolve(ref)
    message = str(info.value)
    for value in ref.payload.values():
        if isinstance(value, str) and len(value) > 3:
            assert value not in message
    return message


@pytest.mark.anyio
@pytest.mark.parametrize(
    "change",
    [
        {"workspace": "/etc"},
        {"workspace": "../../../etc"},
        {"workspace": "ws-x/../../etc-abcdefgh"},
        {"workspace": "state"},
        {"base_dir": "/etc"},
        {"base_dir": "/tmp/../etc"},
        {"workspace": 5},
        {"max_file_bytes": "10"},
        {"max_file_bytes": -1},
        {"max_file_bytes": True},
        {"extra": "key"},
    ],
)
async def test_tampered_payload_is_refused(
    provider: LocalBashProvider, change: dict[str, Any]
) -> None:
    opened = await provider.open(CONFIG, SessionRef("s"))
    await _refused(provider, _tampered(opened.ref, **change))
    await opened.workspace.close()


@pytest.mark.anyio
async def test_symlinked_workspace_is_refused(provider: LocalBashProvider, tmp_path: Path) -> None:
    opened = await provider.open(CONFIG, SessionRef("s"))
    wsdir = provider.layout.workspace_path(opened.ref.payload["workspace"])
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "stolen").write_text("x")
    os.rmdir(wsdir)
    os.symlink(target, wsdir)
    message = await _refused(provider, opened.ref)
    assert "not name a workspace" in message
    assert (target / "stolen").exists()


@pytest.mark.anyio
async def test_symlinked_base_is_refused(
    make_provider: Callable[..., LocalBashProvider], root: Path, tmp_path: Path
) -> None:
    provider = make_provider()
    opened = await provider.open(CONFIG, SessionRef("s"))
    base = Path(provider.layout.base_dir)
    moved = tmp_path / "moved-base"
    base.rename(moved)
    os.symlink(moved, base)
    message = await _refused(make_provider(), opened.ref)
    assert "not a real directory" in message


@pytest.mark.anyio
@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
async def test_another_users_directory_is_refused(provider: LocalBashProvider) -> None:
    opened = await provider.open(CONFIG, SessionRef("s"))
    wsdir = provider.layout.workspace_path(opened.ref.payload["workspace"])
    os.chown(wsdir, 65534, 65534)
    assert "owned by another user" in await _refused(provider, opened.ref)


@pytest.mark.anyio
async def test_a_directory_we_did_not_make_is_refused(provider: LocalBashProvider) -> None:
    opened = await provider.open(CONFIG, SessionRef("s"))
    forged = "ws-forged-abcdefgh"
    os.mkdir(provider.layout.workspace_path(forged), 0o700)
    assert "not a workspace of ours" in await _refused(
        provider, _tampered(opened.ref, workspace=forged)
    )


@pytest.mark.anyio
async def test_other_tmpdir_root_is_refused(provider: LocalBashProvider, tmp_path: Path) -> None:
    opened = await provider.open(CONFIG, SessionRef("s"))
    other = LocalBashProvider(tmpdir_root=tmp_path / "other-root")
    assert "different tmpdir_root" in await _refused(other, opened.ref)


@pytest.mark.anyio
async def test_foreign_provider_and_versions(provider: LocalBashProvider) -> None:
    opened = await provider.open(CONFIG, SessionRef("s"))
    ref = opened.ref
    foreign = WorkspaceRef("docker", ref.payload, ref.capabilities, 2)
    assert "another provider" in await _refused(provider, foreign)
    for version in (0, 3, -1, 10**9):
        message = await _refused(
            provider, WorkspaceRef(ref.provider_id, ref.payload, ref.capabilities, version)
        )
        assert "supports None, 1, 2" in message
    for version in (None, 1, 2):
        ws = await provider.resolve(
            WorkspaceRef(ref.provider_id, ref.payload, ref.capabilities, version)
        )
        assert ws.fs is not None
    bad_caps = WorkspaceRef(ref.provider_id, ref.payload, {"fs", "script"}, 2)
    await _refused(provider, bad_caps)
    await opened.workspace.close()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_payloads = st.dictionaries(
    st.sampled_from(["workspace", "base_dir", "max_file_bytes", "allow_leaf_symlinks", "x"])
    | st.text(max_size=10),
    _json | st.just("/etc") | st.just("../x") | st.just("ws-a-abcdefgh"),
    max_size=5,
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payload=_payloads)
def test_junk_payloads_are_refused_without_echo(
    backend: str, provider: LocalBashProvider, payload: dict[str, Any]
) -> None:
    ref = WorkspaceRef("local-bash", payload, {"fs"}, 2)
    ref = ref_from_json(ref_to_json(ref))
    dumped = json.dumps(payload)

    async def attempt() -> str:
        try:
            await provider.resolve(ref)
        except WorkspaceFailedError as exc:
            return str(exc)
        raise AssertionError("junk payload resolved")

    message = anyio.run(attempt, backend=backend)
    # Only constant messages: nothing from the payload can appear in them.
    assert message in _CONSTANT_MESSAGES, (message, dumped)


_CONSTANT_MESSAGES = {
    "workspace ref payload is malformed",
    "local-bash: workspace ref payload is malformed",
    "local-bash: the workspace ref was made for a different tmpdir_root",
    "local-bash: the workspace ref does not name a workspace directory",
}
