"""One path namespace for the model: a path a tool shows works in a command, and back.

The contract (``corral._mount``): a workspace declares where its commands see
its root (``details()["workspace_path"]``); tool results show paths under it;
an absolute path under it names the workspace-relative file; any other path
is workspace-relative, as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral import open_workspace
from corral._mount import PathView, path_fields, workspace_path_of

from ._real_providers import provider_options, require

pytestmark = pytest.mark.anyio

SHELL_KINDS = ("local-bash", "local-sandbox", "docker")


# -- the mapping itself --------------------------------------------------------------


def test_view_shows_and_accepts_paths_under_the_mount() -> None:
    view = PathView("/workspace")
    assert view.show("/src/a.py") == "/workspace/src/a.py"
    assert view.show("/") == "/workspace"
    assert view.accept("/workspace/src/a.py") == "/src/a.py"
    assert view.accept("/workspace") == "/"
    assert view.accept("/workspace/x/../y") == "/y"


def test_other_paths_stay_workspace_relative() -> None:
    view = PathView("/workspace")
    assert view.accept("/src/a.py") is None
    assert view.accept("workspace/a.py") is None  # relative: as the shell reads it
    assert view.accept("/workspaces/a.py") is None  # a prefix of a name is not the mount
    assert PathView().accept("/a.py") is None
    assert PathView().show("/a.py") == "/a.py"


def test_only_a_canonical_absolute_mount_is_taken() -> None:
    assert workspace_path_of({"workspace_path": "/workspace"}) == "/workspace"
    for bad in ("workspace", "/a/../b", "/a/", 7, None, "/a\x00b"):
        assert workspace_path_of({"workspace_path": bad}) == "/"
    assert workspace_path_of({}) == "/"


def test_path_fields_are_found_from_the_arguments_class() -> None:
    from corral._exec_tools import RunArgs
    from corral._fs_tools import GrepArgs, WriteFileArgs

    assert path_fields(WriteFileArgs) == ("path",)
    assert path_fields(GrepArgs) == ("path",)  # the glob filter is a pattern, not a path
    assert path_fields(RunArgs) == ("cwd",)


# -- every provider -------------------------------------------------------------------


def _options(kind: str, tmp_path: Path) -> dict[str, Any]:
    require(kind)
    return provider_options(kind, tmp_path)


@pytest.mark.parametrize("kind", SHELL_KINDS)
async def test_a_path_a_tool_returned_works_in_a_command(kind: str, tmp_path: Path) -> None:
    async with open_workspace(
        kind, {"fs": True, "shell": True}, provider_options=_options(kind, tmp_path)
    ) as ws:
        mount = (await ws.call("workspace_run", {"command": "pwd"})).data["stdout"].strip()
        wrote = await ws.call(
            "workspace_write_file", {"path": "src/a.txt", "content": "from the file tool\n"}
        )
        shown = wrote.data["path"]
        assert shown == f"{mount}/src/a.txt"
        ran = await ws.call("workspace_run", {"command": f"cat {shown}"})
        assert ran.data["stdout"] == "from the file tool\n"
        # Every result that names files names them the same way.
        for tool, args, key in (
            ("workspace_glob", {"pattern": "**/*.txt"}, "matches"),
            ("workspace_grep", {"pattern": "file tool"}, "matches"),
            ("workspace_ls", {"path": shown.rsplit("/", 1)[0]}, "entries"),
        ):
            data = (await ws.call(tool, args, raise_on_error=True)).data[key]
            first = data[0] if isinstance(data[0], str) else data[0]["path"]
            assert first == shown, tool
        stat = await ws.call("workspace_stat", {"path": shown}, raise_on_error=True)
        assert stat.data["path"] == shown
        # The same path is a working directory too.
        inside = await ws.call("workspace_run", {"command": "ls", "cwd": f"{mount}/src"})
        assert inside.data["stdout"].split() == ["a.txt"]


@pytest.mark.parametrize("kind", SHELL_KINDS)
async def test_a_file_a_command_made_is_read_by_its_absolute_path(
    kind: str, tmp_path: Path
) -> None:
    async with open_workspace(
        kind, {"fs": True, "shell": True}, provider_options=_options(kind, tmp_path)
    ) as ws:
        mount = (await ws.call("workspace_run", {"command": "pwd"})).data["stdout"].strip()
        made = f"{mount}/made/by_shell.txt"
        await ws.call("workspace_run", {"command": f"mkdir -p {mount}/made"}, raise_on_error=True)
        await ws.call("workspace_run", {"command": f"touch {made}"}, raise_on_error=True)
        await ws.call(
            "workspace_write_file", {"path": made, "content": "edited\n"}, raise_on_error=True
        )
        read = await ws.call("workspace_read_file", {"path": made}, raise_on_error=True)
        assert read.data["content"] == "edited\n"
        assert read.data["path"] == made
        # Workspace-relative paths still name the same file, with or without "/".
        for alias in ("made/by_shell.txt", "/made/by_shell.txt"):
            again = await ws.call("workspace_read_file", {"path": alias}, raise_on_error=True)
            assert again.data["content"] == "edited\n"
        ran = await ws.call("workspace_run", {"command": f"cat {made}"})
        assert ran.data["stdout"] == "edited\n"
        removed = await ws.call("workspace_rm", {"path": mount}, raise_on_error=False)
        assert removed.error_code == "invalid_argument"  # the mount is the root


@pytest.mark.parametrize("kind", SHELL_KINDS)
async def test_descriptions_say_where_the_workspace_is(kind: str, tmp_path: Path) -> None:
    async with open_workspace(
        kind, {"fs": True, "shell": True}, provider_options=_options(kind, tmp_path)
    ) as ws:
        mount = (await ws.call("workspace_run", {"command": "pwd"})).data["stdout"].strip()
        described = {t.name: t.description for t in ws.tools}
        for name in ("workspace_run", "workspace_write_file", "workspace_read_file"):
            assert f"The workspace is the directory {mount}" in described[name]
        child = ws.toolset.inherit()
        assert f"directory {mount}" in child.tool("workspace_run").description


async def test_in_memory_keeps_the_plain_view(tmp_path: Path) -> None:
    async with open_workspace("in-memory", {"fs": True}) as ws:
        wrote = await ws.call("workspace_write_file", {"path": "a.txt", "content": "x"})
        assert wrote.data["path"] == "/a.txt"
        globbed = await ws.call("workspace_glob", {"pattern": "*"})
        assert globbed.data["matches"] == ["/a.txt"]
        assert (
            "The workspace is the directory"
            not in ws.toolset.tool("workspace_write_file").description
        )


async def test_a_lazy_session_explains_paths_without_opening() -> None:
    async with open_workspace("in-memory", {"fs": True}, open_strategy="lazy") as ws:
        assert ws.ref is None
        assert (
            "relative to the workspace root" in ws.toolset.tool("workspace_read_file").description
        )
