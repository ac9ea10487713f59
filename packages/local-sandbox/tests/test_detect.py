"""Fail-closed backend detection: no usable bubblewrap, no workspace."""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

import pytest

import corral
import corral.provider
from corral_local_sandbox import LocalSandboxProvider

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="bubblewrap is Linux-only"
)


def _sandbox_cgroups() -> set[str]:
    return set(
        glob.glob("/sys/fs/cgroup/*/corral-sandbox-*")
        + glob.glob("/sys/fs/cgroup/corral-sandbox-*")
    )


async def _open(tmp_path: Path, **options: object) -> corral.provider.OpenedWorkspace:
    provider = LocalSandboxProvider(tmpdir_root=str(tmp_path), **options)
    return await provider.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef("s"))


def _no_workspace_left(tmp_path: Path) -> bool:
    return not glob.glob(str(tmp_path / "corral-local-sandbox-*" / "ws-*"))


@pytest.mark.anyio
async def test_missing_bwrap_path_fails_with_how_to_fix(tmp_path: Path) -> None:
    before = _sandbox_cgroups()
    with pytest.raises(corral.WorkspaceFailedError) as info:
        await _open(tmp_path, bwrap_path=str(tmp_path / "no-such-bwrap"))
    message = info.value.message
    assert "not found" in message
    assert "apt install bubblewrap" in message
    assert "unsandboxed" in message
    assert info.value.transient is False
    assert _no_workspace_left(tmp_path)
    assert _sandbox_cgroups() == before


@pytest.mark.anyio
async def test_bwrap_not_on_an_empty_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(corral.WorkspaceFailedError) as info:
        await _open(tmp_path)
    assert "not on PATH" in info.value.message
    assert "bwrap_path" in info.value.message


@pytest.mark.anyio
async def test_bwrap_that_cannot_create_namespaces(tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1" in --version) echo "bubblewrap 0.8.0"; exit 0;;\n'
        "  --help) echo usage; exit 0;;\nesac\n"
        'echo "bwrap: setting up uid map: Permission denied" >&2\nexit 1\n'
    )
    fake.chmod(0o755)
    before = _sandbox_cgroups()
    with pytest.raises(corral.WorkspaceFailedError) as info:
        await _open(tmp_path, bwrap_path=str(fake))
    message = info.value.message
    assert "user namespaces" in message
    assert "setting up uid map: Permission denied" in message
    assert _no_workspace_left(tmp_path)
    assert _sandbox_cgroups() == before


@pytest.mark.anyio
async def test_something_that_is_not_bwrap(tmp_path: Path) -> None:
    with pytest.raises(corral.WorkspaceFailedError) as info:
        await _open(tmp_path, bwrap_path="/bin/false")
    assert "does not look like bubblewrap" in info.value.message


@pytest.mark.anyio
async def test_resolve_redetects(tmp_path: Path) -> None:
    # A ref made elsewhere does not bypass detection: resolve fails closed too.
    provider = LocalSandboxProvider(tmpdir_root=str(tmp_path), bwrap_path=os.devnull)
    opened = await provider.open(
        corral.ProviderConfig("local-sandbox"), corral.SessionRef("s"), frozenset({"fs"})
    )
    ref = corral.WorkspaceRef(
        "local-sandbox", opened.ref.payload, frozenset({"fs", "shell"}), schema_version=2
    )
    try:
        with pytest.raises(corral.WorkspaceFailedError) as info:
            await provider.resolve(ref)
        assert "bubblewrap" in info.value.message
    finally:
        await opened.workspace.close()
