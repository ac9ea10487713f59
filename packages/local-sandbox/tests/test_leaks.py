"""Nothing outlives what owns it: CLI-style calls reuse, close releases, open sweeps orphans."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

import corral
import corral.provider
from corral_local_sandbox import LocalSandboxProvider
from corral_local_sandbox import _cgroup as cgroup_mod

# One `corral call`: resolve the workspace, run one command, exit without closing.
CLI_CALL = """
import sys, anyio, corral
from corral_local_sandbox import LocalSandboxProvider

async def main():
    ref = corral.ref_from_json(sys.argv[2])
    ws = await LocalSandboxProvider(tmpdir_root=sys.argv[1]).resolve(ref)
    result = await ws.shell.run(corral.provider.CommandRequest("touch call-" + sys.argv[3]))
    assert result.exit_code == 0, result

anyio.run(main)
"""


def _scratch_dirs(tmp: Path) -> set[str]:
    return {p for p in glob.glob(f"{tmp}/corral-sandbox-*") if "-probe-" not in p}


def _cgroups(base_dir: str) -> set[str]:
    tag = cgroup_mod.base_tag(base_dir)
    pattern = f"{cgroup_mod.CGROUP_PREFIX}{tag}-*"
    return set(glob.glob(f"/sys/fs/cgroup/*/{pattern}") + glob.glob(f"/sys/fs/cgroup/{pattern}"))


@pytest.mark.bwrap
@pytest.mark.anyio
async def test_cli_calls_reuse_the_workspace_resources_and_close_releases_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A private temp dir for this process and the calls: other test runs sharing
    # /tmp cannot blur the count.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    provider = LocalSandboxProvider(tmpdir_root=str(tmp_path))
    base = provider.layout.base_dir
    opened = await provider.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef("cli"))
    ws: Any = opened.workspace
    try:
        owned = _cgroups(base)
        assert owned == set(ws.details()["cgroups"])
        assert owned  # root in CI: pids and memory
        ref = corral.ref_to_json(opened.ref)
        for i in range(5):
            done = subprocess.run(
                [sys.executable, "-c", CLI_CALL, str(tmp_path), ref, str(i)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, done.stderr[-2000:]
        names = sorted(e.name for e in await ws.fs.ls("/"))
        assert names == [f"call-{i}" for i in range(5)]
        assert _scratch_dirs(tmp) == set()
        assert _cgroups(base) == owned  # the same cgroup, reused five times
    finally:
        await ws.close()
    assert _cgroups(base) == set()
    assert _scratch_dirs(tmp) == set()


@pytest.mark.bwrap
@pytest.mark.anyio
async def test_open_sweeps_cgroups_of_workspaces_that_are_gone(tmp_path: Path) -> None:
    provider = LocalSandboxProvider(tmpdir_root=str(tmp_path))
    base = provider.layout.base_dir
    lost = await provider.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef("lost"))
    orphans = set(lost.workspace.details()["cgroups"])  # type: ignore[attr-defined]
    assert orphans
    # A temp cleaner (or a crash plus cleanup) removes the workspace behind corral's back.
    name = lost.ref.payload["workspace"]
    provider.layout.remove_workspace(name)
    assert _cgroups(base) == orphans
    fresh = await provider.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef("new"))
    try:
        assert _cgroups(base) == set(fresh.workspace.details()["cgroups"])  # type: ignore[attr-defined]
        assert not orphans & _cgroups(base)
    finally:
        await fresh.workspace.close()
        await lost.workspace.close()


def test_one_bad_entry_never_stops_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    index, parent, live_state = tmp_path / "index", tmp_path / "cg", tmp_path / "state-live"
    index.mkdir()
    parent.mkdir()
    live_state.mkdir()
    base = str(tmp_path / "base")
    gone = [cgroup_mod.cgroup_name(base, f"ws-gone-{i}") for i in range(3)]
    live = cgroup_mod.cgroup_name(base, "ws-live")
    for name in gone:
        (index / name).symlink_to(tmp_path / "state-gone")
    (index / live).symlink_to(live_state)
    stale = cgroup_mod.cgroup_name(base, "ws-unrecorded-old")
    fresh = cgroup_mod.cgroup_name(base, "ws-unrecorded-new")
    for name in [*gone, live, stale, fresh, "docker"]:
        (parent / name).mkdir()
    seen: list[str] = []

    def remove(path: str) -> None:
        seen.append(os.path.basename(path))
        if len(seen) == 1:
            raise RecursionError("a pathological entry")
        os.rmdir(path)

    monkeypatch.setattr(cgroup_mod, "remove_cgroup", remove)
    monkeypatch.setattr(cgroup_mod, "_UNRECORDED_GRACE_S", -3600.0)  # "fresh" is not fresh
    placement = cgroup_mod.Placement(str(parent), 1, frozenset({"pids"}))
    removed = cgroup_mod.sweep_orphans([placement], str(index))
    assert sorted(seen) == sorted([*gone, stale, fresh])  # never the live one, nor docker's
    assert removed == 4
    assert (parent / live).is_dir()
    assert (parent / "docker").is_dir()
    assert sorted(p.name for p in index.iterdir()) == sorted([seen[0], live])
    assert "orphan" in caplog.text
    monkeypatch.setattr(cgroup_mod, "_UNRECORDED_GRACE_S", 3600.0)
    (parent / stale).mkdir()
    assert cgroup_mod.sweep_orphans([placement], str(index)) == 1  # seen[0] again, not stale
    assert (parent / stale).is_dir()
