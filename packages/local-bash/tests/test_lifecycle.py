"""open / resolve / close of local-bash workspaces on the real filesystem."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

import corral
import corral.provider
from corral import ref_from_json, ref_to_json
from corral.provider import (
    OperationError,
    ProviderConfig,
    SessionRef,
    WorkspaceEvictedError,
    WorkspaceFailedError,
)
from corral_local_bash import LocalBashProvider

CONFIG = ProviderConfig(kind="local-bash")
ALL = frozenset({"fs", "shell", "code", "process", "snapshot"})


def _ws_dir(provider: LocalBashProvider, ref: corral.WorkspaceRef) -> Path:
    return Path(provider.layout.workspace_path(ref.payload["workspace"]))


@pytest.mark.anyio
async def test_open_write_resolve_close(
    make_provider: Callable[..., LocalBashProvider], root: Path
) -> None:
    provider = make_provider()
    opened = await provider.open(CONFIG, SessionRef("sess-1"))
    ws, ref = opened.workspace, opened.ref
    assert isinstance(provider, corral.provider.WorkspaceProvider)
    assert ref.provider_id == "local-bash"
    assert ref.schema_version == 2
    assert ref.capabilities == ALL
    assert set(ref.payload) == {"workspace", "base_dir", "max_file_bytes", "allow_leaf_symlinks"}
    wsdir = _ws_dir(provider, ref)
    assert wsdir.parent.parent == root
    assert stat.S_IMODE(wsdir.stat().st_mode) == 0o700
    assert ws.fs is not None
    await ws.fs.write_file("/notes/a.txt", b"hello")
    assert (wsdir / "notes" / "a.txt").read_bytes() == b"hello"
    details = corral.provider.describe_workspace(ws)
    assert details["provider"] == "local-bash"
    assert details["root"] == str(wsdir)
    assert details["resolver"] in ("openat2", "walk")

    # A fresh provider, as in a new process, re-attaches from the JSON ref.
    other = make_provider()
    again = await other.resolve(ref_from_json(ref_to_json(ref)))
    assert again.fs is not None
    assert await again.fs.read_file("notes/a.txt") == b"hello"
    assert again.id == ws.id
    await again.fs.write_file("/b.txt", b"from resolved")
    assert await ws.fs.read_file("/b.txt") == b"from resolved"

    await ws.close()
    await ws.close()  # idempotent
    assert not wsdir.exists()
    assert not Path(provider.layout.state_path(ref.payload["workspace"])).exists()
    with pytest.raises(OperationError) as closed:
        await ws.fs.read_file("/notes/a.txt")
    assert closed.value.code == "closed"
    # The other live handle notices its directory is gone.
    with pytest.raises(WorkspaceEvictedError):
        await again.fs.read_file("/b.txt")
    await again.close()

    with pytest.raises(WorkspaceFailedError, match="lost") as lost:
        await make_provider().resolve(ref)
    assert not lost.value.transient
    assert not wsdir.exists()  # never recreated empty


@pytest.mark.anyio
async def test_sessions_are_isolated(provider: LocalBashProvider) -> None:
    a = await provider.open(CONFIG, SessionRef("alice"))
    b = await provider.open(CONFIG, SessionRef("alice"))  # even with the same session id
    assert a.ref.payload["workspace"] != b.ref.payload["workspace"]
    assert a.workspace.id != b.workspace.id
    assert a.workspace.fs is not None
    assert b.workspace.fs is not None
    await a.workspace.fs.write_file("/secret.txt", b"a's")
    with pytest.raises(OperationError) as missing:
        await b.workspace.fs.read_file("/secret.txt")
    assert missing.value.code == "not_found"
    assert await b.workspace.fs.ls("/") == []
    await a.workspace.close()
    assert await b.workspace.fs.ls("/") == []
    await b.workspace.close()


@pytest.mark.anyio
async def test_declared_capabilities_build_only_those(provider: LocalBashProvider) -> None:
    opened = await provider.open(CONFIG, SessionRef("s"), frozenset({"fs"}))
    ws = opened.workspace
    assert opened.ref.capabilities == {"fs"}
    assert ws.fs is not None
    assert ws.shell is None
    assert ws.snapshot is None
    resolved = await provider.resolve(opened.ref)
    assert resolved.shell is None
    assert resolved.fs is not None
    await resolved.close()

    snap_only = await provider.open(CONFIG, SessionRef("s"), frozenset({"snapshot"}))
    assert snap_only.ref.capabilities == {"snapshot"}
    assert snap_only.workspace.fs is None
    assert snap_only.workspace.snapshot is not None
    await snap_only.workspace.close()


@pytest.mark.anyio
async def test_undeliverable_capability_fails_open_by_name(
    provider: LocalBashProvider, root: Path
) -> None:
    with pytest.raises(WorkspaceFailedError, match="cannot provide capabilities: git, script"):
        await provider.open(CONFIG, SessionRef("s"), frozenset({"fs", "git", "script"}))
    # Nothing was created.
    assert not root.exists() or not any(
        n.startswith("ws-") for n in os.listdir(provider.layout.base_dir)
    )


@pytest.mark.anyio
async def test_config_checks(provider: LocalBashProvider) -> None:
    with pytest.raises(WorkspaceFailedError, match="another provider kind"):
        await provider.open(ProviderConfig(kind="docker"), SessionRef("s"))
    with pytest.raises(WorkspaceFailedError, match="unknown provider options: bogus"):
        await provider.open(ProviderConfig("local-bash", {"bogus": 1}), SessionRef("s"))
    with pytest.raises(WorkspaceFailedError, match="max_file_bytes"):
        await provider.open(ProviderConfig("local-bash", {"max_file_bytes": "1"}), SessionRef("s"))
    opened = await provider.open(
        ProviderConfig("local-bash", {"max_file_bytes": 4}), SessionRef("s")
    )
    assert opened.ref.payload["max_file_bytes"] == 4
    assert opened.workspace.fs is not None
    with pytest.raises(OperationError) as big:
        await opened.workspace.fs.write_file("/f", b"12345")
    assert big.value.code == "too_large"
    resolved = await provider.resolve(opened.ref)
    assert resolved.fs is not None
    with pytest.raises(OperationError):
        await resolved.fs.write_file("/f", b"12345")
    await opened.workspace.close()


def test_constructor_validation(root: Path) -> None:
    with pytest.raises(ValueError, match="max_file_bytes"):
        LocalBashProvider(tmpdir_root=root, max_file_bytes=0)
    with pytest.raises(ValueError, match="compresslevel"):
        LocalBashProvider(tmpdir_root=root, snapshot_compresslevel=0)


@pytest.mark.anyio
async def test_windows_is_refused(
    provider: LocalBashProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    import corral_posix._provider as base

    monkeypatch.setattr(base, "_os_name", lambda: "nt")
    with pytest.raises(WorkspaceFailedError) as info:
        await provider.open(CONFIG, SessionRef("s"))
    assert str(info.value) == (
        "local-bash: Windows is not supported. Use WSL and run the agent inside it."
    )


@pytest.mark.anyio
async def test_provider_holds_no_session_state(provider: LocalBashProvider) -> None:
    before = dict(vars(provider))
    opened = await provider.open(CONFIG, SessionRef("s"))
    await provider.resolve(opened.ref)
    assert dict(vars(provider)) == before
    await opened.workspace.close()
