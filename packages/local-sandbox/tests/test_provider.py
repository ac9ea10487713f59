"""The provider: registration, options, public surface, resolve and resource cleanup."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import anyio
import pytest

import corral
import corral.provider
import corral_local_sandbox
from corral_local_sandbox import LocalSandboxProvider, SandboxLimits
from corral_local_sandbox._cgroup import base_tag


def _cgroups(base_dir: str) -> set[str]:
    pattern = f"corral-sandbox-{base_tag(base_dir)}-*"
    return set(glob.glob(f"/sys/fs/cgroup/*/{pattern}") + glob.glob(f"/sys/fs/cgroup/{pattern}"))


def _wrapper(shell: Any) -> Any:
    """The sandbox wrapper under the shell decorators (quota, protected paths)."""
    while not hasattr(shell, "wrapper"):
        shell = shell._inner
    return shell.wrapper


def test_public_surface() -> None:
    assert sorted(corral_local_sandbox.__all__) == sorted(
        name
        for name in dir(corral_local_sandbox)
        if not name.startswith("_") and name not in ("annotations",)
    )
    for name in corral_local_sandbox.__all__:
        assert getattr(corral_local_sandbox, name).__doc__


def test_registered_through_the_entry_point() -> None:
    spec = corral.load_plugins().provider("local-sandbox")
    assert spec.capabilities == {"fs", "shell", "code", "process", "script", "snapshot"}
    assert spec.distribution == "corral-local-sandbox"
    assert spec.version
    provider = spec.create({"network": "on", "limits": {"processes": 32}})
    assert isinstance(provider, LocalSandboxProvider)
    assert provider.policy.network.mode == "on"
    assert provider.policy.limits.processes == 32
    assert provider.provider_id == "local-sandbox"


@pytest.mark.parametrize(
    "options",
    [
        {"network": "maybe"},
        {"limits": {"processes": 0}},
        {"limits": {"bogus": 1}},
        {"limits": {"processes": True}},
        {"protected_paths": ["../x"]},
        {"protected_paths": ".bashrc"},
        {"shell_limits": {"open_files": 64}},
    ],
)
def test_bad_options(options: dict[str, Any]) -> None:
    with pytest.raises((ValueError, TypeError)):
        LocalSandboxProvider(**options)


def test_limits_defaults_and_prlimit_args() -> None:
    limits = SandboxLimits(cpu_seconds=None)
    args = limits.prlimit_args()
    assert "--nproc=256:256" in args
    assert "--core=0:0" in args
    assert not any(a.startswith("--cpu") for a in args)


@pytest.mark.anyio
async def test_fs_only_workspace_needs_no_sandbox(tmp_path: Path) -> None:
    provider = LocalSandboxProvider(tmpdir_root=str(tmp_path), bwrap_path=str(tmp_path / "none"))
    opened = await provider.open(
        corral.ProviderConfig("local-sandbox"), corral.SessionRef("s"), frozenset({"fs"})
    )
    try:
        assert opened.workspace.shell is None
        assert opened.workspace.fs is not None
        assert opened.workspace.details()["backend"] is None  # type: ignore[attr-defined]
    finally:
        await opened.workspace.close()


@pytest.mark.bwrap
@pytest.mark.anyio
async def test_resolve_open_and_close_release_everything(tmp_path: Path) -> None:
    provider = LocalSandboxProvider(tmpdir_root=str(tmp_path))
    opened = await provider.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef("s"))
    ws: Any = opened.workspace
    assert (
        await ws.shell.run(corral.provider.CommandRequest("touch made-by-shell"))
    ).exit_code == 0
    scratch = Path(_wrapper(ws.shell).seccomp_file).parent
    assert (scratch / "filter.bpf").is_file()
    # Kept beside the workspace's state, never in the shared temp dir.
    assert scratch.parent == Path(provider.layout.state_path(opened.ref.payload["workspace"]))
    owned = _cgroups(provider.layout.base_dir)
    ref = corral.ref_from_json(corral.ref_to_json(opened.ref))
    again: Any = await LocalSandboxProvider(tmpdir_root=str(tmp_path)).resolve(ref)
    try:
        assert again.id == ws.id
        assert again.details()["backend"] == "bubblewrap"
        result = await again.shell.run(corral.provider.CommandRequest("ls made-by-shell"))
        assert result.stdout == "made-by-shell\n"
        assert _wrapper(again.shell).cgroup_procs == _wrapper(ws.shell).cgroup_procs
        assert _cgroups(provider.layout.base_dir) == owned  # reused, not duplicated
    finally:
        await again.close()
        await ws.close()
    assert _cgroups(provider.layout.base_dir) == set()
    assert not scratch.exists()


@pytest.mark.bwrap
@pytest.mark.anyio
async def test_concurrent_opens_get_their_own_sandbox(tmp_path: Path) -> None:
    provider = LocalSandboxProvider(tmpdir_root=str(tmp_path))
    opened: list[Any] = []

    async def one(i: int) -> None:
        opened.append(
            await provider.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef(f"s{i}"))
        )

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(one, i)
    try:
        wrappers = {_wrapper(o.workspace.shell).cgroup_procs for o in opened}
        assert len(wrappers) == 3
        for o in opened:
            await o.workspace.shell.run(
                corral.provider.CommandRequest(f"touch {o.workspace.id.split(':')[1]}")
            )
        for o in opened:
            listing = await o.workspace.fs.ls("/")
            assert [e.name for e in listing if not e.name.startswith(".")] == [
                o.workspace.id.split(":")[1]
            ]
    finally:
        for o in opened:
            await o.workspace.close()


@pytest.mark.anyio
async def test_file_tools_cannot_plant_protected_files(tmp_path: Path) -> None:
    provider = LocalSandboxProvider(tmpdir_root=str(tmp_path), bwrap_path=str(tmp_path / "none"))
    opened = await provider.open(
        corral.ProviderConfig("local-sandbox"), corral.SessionRef("s"), frozenset({"fs"})
    )
    fs: Any = opened.workspace.fs
    try:
        await fs.write_file("/src/main.py", b"print(1)\n")
        await fs.mkdir("/.git")
        await fs.write_file("/.git/HEAD", b"ref: refs/heads/main\n")
        denied = [
            fs.write_file("/.git/hooks/pre-commit", b"evil"),
            fs.write_file(".GIT/Hooks/pre-commit", b"evil"),
            fs.write_file("/src/../.bashrc", b"evil"),
            fs.mkdir("/.vscode", parents=True),
            fs.write_file("/.vscode/tasks.json", b"{}"),
            fs.edit_file("/.mcp.json", "a", "b"),
            fs.rm("/.git", recursive=True),
        ]
        for attempt in denied:
            with pytest.raises(corral.OperationError) as info:
                await attempt
            assert info.value.code == "policy_denied"
        assert await fs.read_file("/src/main.py") == b"print(1)\n"
        await fs.rm("/src", recursive=True)
        assert [e.name for e in await fs.ls("/")] == [".git"]
    finally:
        await opened.workspace.close()


@pytest.mark.bwrap
@pytest.mark.anyio
async def test_memory_limit_without_a_cgroup_fails_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral_local_sandbox import _cgroup

    monkeypatch.setattr(_cgroup, "find_placements", lambda wanted: ([], sorted(wanted)))
    provider = LocalSandboxProvider(tmpdir_root=str(tmp_path))
    with pytest.raises(corral.WorkspaceFailedError) as info:
        await provider.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef("s"))
    assert "memory" in info.value.message
    assert "'memory_bytes': None" in info.value.message
    lifted = LocalSandboxProvider(
        tmpdir_root=str(tmp_path), limits={"memory_bytes": None, "processes": None}
    )
    opened = await lifted.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef("s"))
    try:
        assert opened.workspace.details()["memory_limit"] is None  # type: ignore[attr-defined]
    finally:
        await opened.workspace.close()


@pytest.mark.bwrap
@pytest.mark.anyio
async def test_root_without_seccomp_fails_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral_local_sandbox import _detect

    if os.geteuid() != 0:
        pytest.skip("the rule is for a sandbox that maps to host root")
    monkeypatch.setattr(_detect, "native_arch", lambda: None)
    provider = LocalSandboxProvider(tmpdir_root=str(tmp_path))
    with pytest.raises(corral.WorkspaceFailedError) as info:
        await provider.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef("s"))
    assert "seccomp" in info.value.message
    assert "set-id" in info.value.message
    assert _cgroups(provider.layout.base_dir) == set()
