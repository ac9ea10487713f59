"""The tmpdir layout: base directory checks, workspace creation, and locating a ref's workspace."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from corral.provider import WorkspaceFailedError
from corral_posix import TmpdirLayout, TmpdirRefPayload, sanitize_session_id


def _payload(layout: TmpdirLayout, name: str) -> TmpdirRefPayload:
    return TmpdirRefPayload(workspace=name, base_dir=layout.base_dir, max_file_bytes=1024)


@pytest.fixture
def layout(tmp_path: Path) -> TmpdirLayout:
    return TmpdirLayout("test-prov", tmp_path)


def test_create_makes_private_dirs_and_a_marker(layout: TmpdirLayout) -> None:
    name = layout.create_workspace("sess/../1 ☃")
    assert layout.is_workspace_name(name)
    assert name.startswith("ws-sess____1__-")
    base = os.stat(layout.base_dir)
    assert stat.S_IMODE(base.st_mode) == 0o700
    assert os.path.basename(layout.base_dir) == f"corral-test-prov-{os.geteuid()}"
    ws = os.stat(layout.workspace_path(name))
    assert stat.S_IMODE(ws.st_mode) == 0o700
    assert os.listdir(layout.workspace_path(name)) == []  # the marker is not in the workspace
    assert os.path.isdir(layout.snapshot_path(name))
    assert layout.locate(_payload(layout, name)) == layout.workspace_path(name)


def test_sessions_get_distinct_directories(layout: TmpdirLayout) -> None:
    names = {layout.create_workspace("same") for _ in range(5)}
    assert len(names) == 5


@pytest.mark.parametrize(
    ("session_id", "expected"),
    [("abc", "abc"), ("a b/c", "a_b_c"), ("", "_"), ("x" * 100, "x" * 32), ("..", "__")],
)
def test_sanitize_session_id(session_id: str, expected: str) -> None:
    assert sanitize_session_id(session_id) == expected


def test_removed_workspace_is_reported_lost(layout: TmpdirLayout) -> None:
    name = layout.create_workspace("s")
    layout.remove_workspace(name)
    assert not os.path.exists(layout.workspace_path(name))
    assert not os.path.exists(layout.state_path(name))
    with pytest.raises(WorkspaceFailedError, match="lost"):
        layout.locate(_payload(layout, name))


def test_vanished_workspace_dir_is_lost_not_recreated(layout: TmpdirLayout) -> None:
    name = layout.create_workspace("s")
    os.rmdir(layout.workspace_path(name))
    with pytest.raises(WorkspaceFailedError, match="lost"):
        layout.locate(_payload(layout, name))
    assert not os.path.exists(layout.workspace_path(name))


def test_vanished_base_is_lost(layout: TmpdirLayout) -> None:
    name = layout.create_workspace("s")
    layout.remove_workspace(name)
    os.rmdir(os.path.join(layout.base_dir, "state"))
    os.rmdir(layout.base_dir)
    with pytest.raises(WorkspaceFailedError, match="lost"):
        layout.locate(_payload(layout, name))


def test_symlinked_base_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    layout = TmpdirLayout("test-prov", tmp_path)
    os.symlink(real, layout.base_dir)
    with pytest.raises(WorkspaceFailedError, match="not a real directory"):
        layout.check_base()
    with pytest.raises(WorkspaceFailedError):
        layout.create_workspace("s")
    assert list(real.iterdir()) == []


def test_world_writable_base_is_refused(layout: TmpdirLayout) -> None:
    layout.check_base()
    os.chmod(layout.base_dir, 0o777)
    with pytest.raises(WorkspaceFailedError, match="writable by other users"):
        layout.create_workspace("s")


def test_readable_base_is_tightened(layout: TmpdirLayout) -> None:
    layout.check_base()
    os.chmod(layout.base_dir, 0o755)
    layout.check_base()
    assert stat.S_IMODE(os.stat(layout.base_dir).st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_base_owned_by_another_user_is_refused(layout: TmpdirLayout) -> None:
    layout.check_base()
    os.chown(layout.base_dir, 65534, 65534)
    with pytest.raises(WorkspaceFailedError, match="owned by another user"):
        layout.create_workspace("s")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_workspace_owned_by_another_user_is_refused(layout: TmpdirLayout) -> None:
    name = layout.create_workspace("s")
    os.chown(layout.workspace_path(name), 65534, 65534)
    with pytest.raises(WorkspaceFailedError, match="owned by another user"):
        layout.locate(_payload(layout, name))


def test_symlinked_workspace_dir_is_refused(layout: TmpdirLayout, tmp_path: Path) -> None:
    name = layout.create_workspace("s")
    target = tmp_path / "target"
    target.mkdir()
    os.rmdir(layout.workspace_path(name))
    os.symlink(target, layout.workspace_path(name))
    with pytest.raises(WorkspaceFailedError) as info:
        layout.locate(_payload(layout, name))
    assert name not in str(info.value)


def test_directory_without_marker_is_refused(layout: TmpdirLayout) -> None:
    name = "ws-forged-abcdefgh"
    os.makedirs(layout.workspace_path(name), mode=0o700)
    with pytest.raises(WorkspaceFailedError, match="not a workspace of ours"):
        layout.locate(_payload(layout, name))


def test_marker_of_another_provider_is_refused(tmp_path: Path) -> None:
    layout = TmpdirLayout("test-prov", tmp_path)
    name = layout.create_workspace("s")
    marker = Path(layout.state_path(name)) / "marker.json"
    marker.write_text(json.dumps({"provider_id": "other", "workspace": name}))
    with pytest.raises(WorkspaceFailedError, match="not a workspace of ours"):
        layout.locate(_payload(layout, name))


@pytest.mark.parametrize(
    "name",
    ["../etc", "/etc", "ws-../../etc-abcdefgh", "etc", "ws-a-abc", "state", ".trash-x", ""],
)
def test_names_outside_the_pattern_are_refused(layout: TmpdirLayout, name: str) -> None:
    layout.check_base()
    with pytest.raises(WorkspaceFailedError) as info:
        layout.locate(_payload(layout, name))
    assert "does not name a workspace" in str(info.value)
    if name:
        assert name not in str(info.value)


def test_foreign_base_dir_is_refused(layout: TmpdirLayout) -> None:
    name = layout.create_workspace("s")
    payload = TmpdirRefPayload(workspace=name, base_dir="/etc", max_file_bytes=1)
    with pytest.raises(WorkspaceFailedError, match="different tmpdir_root") as info:
        layout.locate(payload)
    assert "/etc" not in str(info.value)


def test_remove_handles_read_only_directories(layout: TmpdirLayout) -> None:
    name = layout.create_workspace("s")
    inner = Path(layout.workspace_path(name)) / "ro"
    inner.mkdir()
    (inner / "f").write_text("x")
    inner.chmod(0o500)
    layout.remove_workspace(name)
    assert not os.path.exists(layout.workspace_path(name))
    layout.remove_workspace(name)  # idempotent


def test_relative_root_and_bad_provider_id_are_rejected() -> None:
    with pytest.raises(ValueError, match="absolute"):
        TmpdirLayout("p", "relative/dir")
    with pytest.raises(ValueError, match="provider_id"):
        TmpdirLayout("../x", "/tmp")


def test_stale_scratch_dirs_are_swept(layout: TmpdirLayout) -> None:
    layout.check_base()
    stale = layout.new_temp_dir("trash")
    Path(stale, "old").mkdir()
    fresh = layout.new_temp_dir("tmp")
    os.utime(stale, (0, 0))
    layout.create_workspace("s")
    assert not os.path.exists(stale)
    assert os.path.isdir(fresh)
