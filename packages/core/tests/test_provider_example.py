"""The third-party provider example of packages/core/README.md runs, and wrong values are caught.

A provider returning a value its protocol's types forbid (a file type spelled
``"directory"``; ``corral.FileType`` is ``file``/``dir``/``symlink``/``other``)
fails ``mypy`` before it ever reaches conformance, and the tool layer refuses
it at run time with a clear error instead of passing it on to the model.
"""

from __future__ import annotations

import re
import subprocess
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest

import corral
import corral.provider

pytestmark = pytest.mark.anyio

CORE_README = Path(__file__).parents[1] / "README.md"
ROOT = Path(__file__).parents[3]
MARKER = "# A third-party provider"


def example_code() -> str:
    blocks = re.findall(r"```python\n(.*?)```", CORE_README.read_text(), flags=re.DOTALL)
    return next(b for b in blocks if b.startswith(MARKER))


def example() -> Any:
    module = types.ModuleType("corral_readme_provider")
    sys.modules[module.__name__] = module
    exec(compile(example_code(), str(CORE_README), "exec"), module.__dict__)
    return module


async def test_the_example_provider_serves_every_file_tool() -> None:
    ex = example()
    plugins = corral.load_plugins([ex.DictPlugin()], entrypoints=False)
    assert ex.KIND in plugins.providers
    async with corral.open_workspace(
        ex.KIND, {"fs": True}, plugins=plugins, raise_on_error=True, close_on_exit=False
    ) as ws:
        await ws.call("workspace_write_file", {"path": "src/a.py", "content": "x = 1\n"})
        await ws.call(
            "workspace_edit_file", {"path": "/src/a.py", "old_text": "1", "new_text": "2"}
        )
        read = await ws.call("workspace_read_file", {"path": "src/a.py"})
        assert read.data["content"] == "x = 2\n"
        listed = await ws.call("workspace_ls", {"path": "/"})
        assert [(e["name"], e["type"]) for e in listed.data["entries"]] == [("src", "dir")]
        globbed = await ws.call("workspace_glob", {"pattern": "**/*.py"})
        assert globbed.data["matches"] == ["/src/a.py"]
        grep = await ws.call("workspace_grep", {"pattern": "x = ", "glob": "*.py"})
        assert [m["path"] for m in grep.data["matches"]] == ["/src/a.py"]
        await ws.call("workspace_mkdir", {"path": "/empty"})
        await ws.call("workspace_rm", {"path": "/src", "recursive": True})
        assert (await ws.call("workspace_stat", {"path": "/empty"})).data["type"] == "dir"
        ref = ws.ref
    assert ref is not None
    # A fresh provider instance resolves the ref to the same workspace; close ends it.
    fresh = ex.DictProvider()
    again = await fresh.resolve(corral.ref_from_json(corral.ref_to_json(ref)))
    assert again.fs is not None
    assert [e.name for e in await again.fs.ls("/")] == ["empty"]
    await again.close()
    with pytest.raises(corral.WorkspaceFailedError):
        await fresh.resolve(ref)
    with pytest.raises(corral.WorkspaceFailedError):
        await fresh.resolve(corral.WorkspaceRef(ex.KIND, {"workspace": 7}, {"fs"}, 1))


async def test_the_example_provider_refuses_what_it_cannot_populate() -> None:
    ex = example()
    plugins = corral.load_plugins([ex.DictPlugin()], entrypoints=False)
    with pytest.raises(corral.ConfigError, match="cannot populate"):
        async with corral.open_workspace(ex.KIND, {"fs": True, "shell": True}, plugins=plugins):
            pass


def _mypy(tmp_path: Path, files: dict[str, str]) -> subprocess.CompletedProcess[str]:
    paths = []
    for name, code in files.items():
        path = tmp_path / name
        path.write_text(code)
        paths.append(str(path))
    # cwd=ROOT: the workspace's mypy configuration (strict, mypy_path) applies.
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "c"), *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


BAD_PROVIDER = """
from collections.abc import Sequence

import corral


class BadFs:
    async def ls(self, path: str = "/") -> Sequence[corral.FileEntry]:
        return [corral.FileEntry("src", "/src", "directory")]

    async def stat(self, path: str) -> corral.FileStat:
        return corral.FileStat(path, type="folder", size=0)
"""


@pytest.mark.slow
def test_the_example_is_strictly_typed_and_a_wrong_file_type_is_a_mypy_error(
    tmp_path: Path,
) -> None:
    good = _mypy(tmp_path, {"readme_provider.py": example_code()})
    assert good.returncode == 0, good.stdout + good.stderr
    bad = _mypy(tmp_path, {"bad_provider.py": BAD_PROVIDER})
    assert bad.returncode == 1, bad.stdout + bad.stderr
    errors = [line for line in bad.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 2, bad.stdout
    assert all("Literal['file', 'dir', 'symlink', 'other']" in line for line in errors)


class _MisspellingFs:
    """A provider bug that slipped past typing (``cast``): "directory" for "dir"."""

    async def ls(self, path: str = "/") -> Sequence[corral.FileEntry]:
        return [corral.FileEntry("src", "/src", cast(corral.FileType, "directory"))]

    async def stat(self, path: str) -> corral.FileStat:
        return corral.FileStat(path, cast(corral.FileType, "directory"), 0)


class _MisspellingProvider:
    provider_id = "misspelling"
    capabilities = frozenset({"fs"})
    schema_version = 1

    async def open(self, config: Any, session: Any, declared: Any = None) -> Any:
        ws = corral.provider.ModularWorkspace(
            "m1", fs=cast(corral.provider.FileSystem, _MisspellingFs())
        )
        return corral.provider.OpenedWorkspace(
            ws, corral.WorkspaceRef("misspelling", {}, {"fs"}, 1)
        )

    async def resolve(self, ref: corral.WorkspaceRef) -> Any:
        raise corral.WorkspaceFailedError("not resumable")


async def test_a_wrong_file_type_is_a_clear_error_at_the_tool_layer() -> None:
    async with corral.open_workspace(_MisspellingProvider(), {"fs": {"read_only": True}}) as ws:
        for tool in ("workspace_ls", "workspace_stat"):
            result = await ws.call(tool, {"path": "/src"})
            assert result.is_error, tool
            assert result.error_code == "failed"
            assert "invalid file type" in result.content
            assert "provider bug" in result.content
            assert "directory" not in result.content  # the bad value is not echoed
