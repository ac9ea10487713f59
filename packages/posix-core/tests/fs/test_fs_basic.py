"""TmpdirFileSystem: the corral.provider.FileSystem semantics, on both resolvers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import corral
import corral.provider
from corral import RegexModuleEngine
from corral.provider import GrepOptions, OperationError
from corral_posix import Resolver, TmpdirFileSystem

pytestmark = pytest.mark.anyio


async def _code(awaitable: object) -> str:
    with pytest.raises(OperationError) as info:
        await awaitable  # type: ignore[misc]
    return info.value.code


def test_satisfies_the_protocol(fs: TmpdirFileSystem, resolver: Resolver, root: Path) -> None:
    assert isinstance(fs, corral.provider.FileSystem)
    assert fs.resolver == resolver
    assert fs.root_path == str(root)
    assert not fs.closed


async def test_write_read_round_trip_in_both_spellings(fs: TmpdirFileSystem, root: Path) -> None:
    await fs.write_file("/notes/a.txt", b"hello\n")
    assert await fs.read_file("notes/a.txt") == b"hello\n"
    assert await fs.read_file("/notes/./b/../a.txt") == b"hello\n"
    assert (root / "notes" / "a.txt").read_bytes() == b"hello\n"
    await fs.write_file("notes/a.txt", b"")
    assert await fs.read_file("/notes/a.txt") == b""


async def test_write_keeps_mode_and_leaves_no_temp_files(fs: TmpdirFileSystem, root: Path) -> None:
    (root / "x.sh").write_text("old")
    os.chmod(root / "x.sh", 0o751)
    await fs.write_file("x.sh", b"new")
    assert (root / "x.sh").stat().st_mode & 0o777 == 0o751
    assert sorted(p.name for p in root.iterdir()) == ["x.sh"]


async def test_read_errors(fs: TmpdirFileSystem, root: Path) -> None:
    (root / "d").mkdir()
    (root / "f").write_text("f")
    assert await _code(fs.read_file("missing")) == "not_found"
    assert await _code(fs.read_file("d")) == "is_a_directory"
    assert await _code(fs.read_file("/")) == "is_a_directory"
    assert await _code(fs.read_file("f/x")) == "not_a_directory"


async def test_write_errors(fs: TmpdirFileSystem, root: Path) -> None:
    (root / "d").mkdir()
    (root / "f").write_text("f")
    assert await _code(fs.write_file("d", b"x")) == "is_a_directory"
    assert await _code(fs.write_file("/", b"x")) == "is_a_directory"
    assert await _code(fs.write_file("f/x", b"x")) == "not_a_directory"
    assert await _code(fs.write_file("f/x/y", b"x")) == "not_a_directory"
    assert (root / "f").read_text() == "f"


async def test_size_cap_applies_to_writes(root: Path, resolver: Resolver) -> None:
    tfs = TmpdirFileSystem(root, resolver=resolver, max_file_bytes=10)
    try:
        assert await _code(tfs.write_file("big", b"x" * 11)) == "too_large"
        await tfs.write_file("ok", b"x" * 10)
        assert not (root / "big").exists()
    finally:
        tfs.close()


async def test_edit_file(fs: TmpdirFileSystem, root: Path) -> None:
    (root / "t.txt").write_text("one two two\n")
    assert await fs.edit_file("t.txt", "one", "1") == 1
    assert await _code(fs.edit_file("t.txt", "two", "2")) == "not_unique"
    assert await fs.edit_file("t.txt", "two", "2", replace_all=True) == 2
    assert (root / "t.txt").read_text() == "1 2 2\n"
    assert await _code(fs.edit_file("t.txt", "zzz", "y")) == "no_match"
    assert await _code(fs.edit_file("t.txt", "", "y")) == "invalid_argument"
    assert await _code(fs.edit_file("missing", "a", "b")) == "not_found"
    (root / "bin").write_bytes(b"\xff\xfe")
    assert await _code(fs.edit_file("bin", "a", "b")) == "unsupported_file_type"


async def test_ls(fs: TmpdirFileSystem, root: Path) -> None:
    (root / "b").mkdir()
    (root / "a.txt").write_text("12345")
    (root / "c").symlink_to("a.txt")
    entries = await fs.ls("/")
    assert [(e.name, e.path, e.type, e.size) for e in entries] == [
        ("a.txt", "/a.txt", "file", 5),
        ("b", "/b", "dir", 0),
        ("c", "/c", "symlink", 0),
    ]
    assert await fs.ls("b") == []
    assert await _code(fs.ls("a.txt")) == "not_a_directory"
    assert await _code(fs.ls("missing")) == "not_found"


async def test_glob(fs: TmpdirFileSystem, root: Path) -> None:
    for rel in ["src/a.py", "src/pkg/b.py", "src/pkg/c.txt", "top.py", "docs/x.md"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    assert await fs.glob("*.py") == ["/top.py"]
    assert await fs.glob("**/*.py") == ["/src/a.py", "/src/pkg/b.py", "/top.py"]
    assert await fs.glob("src/**/*.py") == ["/src/a.py", "/src/pkg/b.py"]
    assert await fs.glob("src/pkg/?.*") == ["/src/pkg/b.py", "/src/pkg/c.txt"]
    assert await fs.glob("*", path="/src") == ["/src/a.py", "/src/pkg"]
    assert await fs.glob("[dt]*") == ["/docs", "/top.py"]
    assert await fs.glob("nope/*.py") == []
    assert await fs.glob("**") == sorted(
        [
            "/docs",
            "/docs/x.md",
            "/src",
            "/src/a.py",
            "/src/pkg",
            "/src/pkg/b.py",
            "/src/pkg/c.txt",
            "/top.py",
        ]
    )
    assert await _code(fs.glob("*", path="/top.py")) == "not_a_directory"


async def test_grep(fs: TmpdirFileSystem, root: Path) -> None:
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("import os\nx = 1\nimport sys\n")
    (root / "src" / "b.txt").write_text("import nothing\n")
    (root / "z.py").write_text("no match\r\nimport re\r\n")
    (root / "bad.txt").write_bytes(b"import \xff\xfe\n")
    engine = RegexModuleEngine()
    result = await fs.grep(engine.compile("^import"), GrepOptions())
    assert [(m.path, m.line_number, m.line) for m in result.matches] == [
        ("/bad.txt", 1, "import \ufffd\ufffd"),
        ("/src/a.py", 1, "import os"),
        ("/src/a.py", 3, "import sys"),
        ("/src/b.txt", 1, "import nothing"),
        ("/z.py", 2, "import re"),
    ]
    assert not result.truncated
    assert result.skipped_paths == ()
    assert result.skipped_binary_paths == ()
    only_py = await fs.grep(engine.compile("import"), GrepOptions(glob="*.py"))
    assert {m.path for m in only_py.matches} == {"/src/a.py", "/z.py"}
    nested = await fs.grep(engine.compile("import"), GrepOptions(glob="src/*.py"))
    assert {m.path for m in nested.matches} == {"/src/a.py"}
    under = await fs.grep(engine.compile("IMPORT", ignore_case=True), GrepOptions(path="/src"))
    assert [m.path for m in under.matches] == ["/src/a.py", "/src/a.py", "/src/b.txt"]
    single = await fs.grep(engine.compile("x"), GrepOptions(path="src/a.py"))
    assert [(m.path, m.line_number) for m in single.matches] == [("/src/a.py", 2)]
    assert await _code(fs.grep(engine.compile("x"), GrepOptions(path="/missing"))) == "not_found"
    assert (
        await _code(fs.grep(engine.compile("x"), GrepOptions(max_results=0))) == "invalid_argument"
    )


async def test_grep_truncates_at_max_results_in_path_order(
    fs: TmpdirFileSystem, root: Path
) -> None:
    for name in ["a", "a-b", "c"]:
        (root / name).mkdir()
        (root / name / "f").write_text("hit\nhit\n")
    (root / "a.txt").write_text("hit\n")
    engine = RegexModuleEngine()
    result = await fs.grep(engine.compile("hit"), GrepOptions(max_results=3))
    assert result.truncated
    # String order of full paths: "/a-b/f" < "/a.txt" < "/a/f".
    assert [(m.path, m.line_number) for m in result.matches] == [
        ("/a-b/f", 1),
        ("/a-b/f", 2),
        ("/a.txt", 1),
    ]
    exact = await fs.grep(engine.compile("hit"), GrepOptions(max_results=7))
    assert not exact.truncated
    assert len(exact.matches) == 7
    paths = [m.path for m in exact.matches]
    assert paths == sorted(paths)


async def test_stat(fs: TmpdirFileSystem, root: Path) -> None:
    (root / "f").write_text("abc")
    os.chmod(root / "f", 0o640)
    (root / "d").mkdir()
    (root / "l").symlink_to("/etc/passwd")
    st = await fs.stat("/f")
    assert (st.path, st.type, st.size, st.mode) == ("/f", "file", 3, 0o640)
    assert st.mtime == pytest.approx((root / "f").stat().st_mtime)
    assert (await fs.stat("d")).type == "dir"
    assert (await fs.stat("/")).type == "dir"
    link = await fs.stat("l")
    assert (link.type, link.path) == ("symlink", "/l")
    assert await _code(fs.stat("missing")) == "not_found"


async def test_mkdir(fs: TmpdirFileSystem, root: Path) -> None:
    await fs.mkdir("a")
    assert (root / "a").is_dir()
    assert await _code(fs.mkdir("a")) == "exists"
    await fs.mkdir("a", parents=True)
    assert await _code(fs.mkdir("x/y")) == "not_found"
    await fs.mkdir("x/y/z", parents=True)
    assert (root / "x/y/z").is_dir()
    (root / "f").write_text("f")
    assert await _code(fs.mkdir("f", parents=True)) == "exists"
    assert await _code(fs.mkdir("f/g", parents=True)) == "not_a_directory"
    assert await _code(fs.mkdir("/")) == "exists"
    await fs.mkdir("/", parents=True)


async def test_rm(fs: TmpdirFileSystem, root: Path) -> None:
    (root / "d/e").mkdir(parents=True)
    (root / "d/e/f").write_text("f")
    (root / "g").write_text("g")
    assert await _code(fs.rm("d")) == "not_empty"
    assert await _code(fs.rm("missing")) == "not_found"
    assert await _code(fs.rm("/")) == "invalid_argument"
    assert await _code(fs.rm("/d/..")) == "invalid_argument"
    await fs.rm("g")
    await fs.rm("d", recursive=True)
    assert list(root.iterdir()) == []
    (root / "empty").mkdir()
    await fs.rm("empty")
    assert not (root / "empty").exists()


async def test_close_then_every_call_is_closed(fs: TmpdirFileSystem) -> None:
    fs.close()
    fs.close()
    assert fs.closed
    assert await _code(fs.read_file("a")) == "closed"
    assert await _code(fs.ls()) == "closed"


async def test_reattach_follows_a_swapped_directory(
    fs: TmpdirFileSystem, root: Path, tmp_path: Path
) -> None:
    (root / "a").write_text("old")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "a").write_text("new")
    root.rename(tmp_path / "retired")
    fresh.rename(root)
    with pytest.raises(corral.WorkspaceEvictedError) as info:
        await fs.read_file("a")
    assert info.value.provider_id == "test"
    fs.reattach()
    assert await fs.read_file("a") == b"new"


async def test_deleted_root_is_evicted_not_empty(fs: TmpdirFileSystem, root: Path) -> None:
    (root / "a").write_text("x")
    (root / "a").unlink()
    root.rmdir()
    with pytest.raises(corral.WorkspaceEvictedError):
        await fs.ls("/")
    root.mkdir()  # a new, empty directory under the same name is not the old workspace
    with pytest.raises(corral.WorkspaceEvictedError):
        await fs.ls("/")


def test_constructor_errors(tmp_path: Path) -> None:
    with pytest.raises(corral.WorkspaceFailedError):
        TmpdirFileSystem(tmp_path / "missing")
    with pytest.raises(corral.ConfigError):
        TmpdirFileSystem(tmp_path, resolver="bogus")  # type: ignore[arg-type]
