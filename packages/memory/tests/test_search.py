"""glob and grep of the in-memory provider."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest

import corral
import corral.provider
from corral_memory import InMemoryProvider

pytestmark = pytest.mark.anyio

Compile = Callable[..., corral.provider.Matcher]


async def _code(awaitable: object) -> str:
    with pytest.raises(corral.OperationError) as info:
        await awaitable  # type: ignore[misc]
    return info.value.code


@pytest.fixture
async def tree(fs: corral.provider.FileSystem) -> corral.provider.FileSystem:
    """A small project tree."""
    for path, data in {
        "/a.txt": b"alpha\n",
        "/a/b.py": b"import os\nprint('alpha')\n",
        "/a/c/d.py": b"x = 1\n",
        "/a/c/e.txt": b"beta\n",
        "/src/main.py": b"alpha = 2\nbeta = 3\nalpha + beta\n",
    }.items():
        await fs.write_file(path, data)
    await fs.mkdir("/empty")
    return fs


async def test_glob_star_stays_in_one_component(tree: corral.provider.FileSystem) -> None:
    assert await tree.glob("*") == ["/a", "/a.txt", "/empty", "/src"]
    assert await tree.glob("*.txt") == ["/a.txt"]
    assert await tree.glob("a/*") == ["/a/b.py", "/a/c"]


async def test_glob_double_star_any_depth_sorted_as_strings(
    tree: corral.provider.FileSystem,
) -> None:
    assert await tree.glob("**/*.py") == ["/a/b.py", "/a/c/d.py", "/src/main.py"]
    assert await tree.glob("**/*.txt") == ["/a.txt", "/a/c/e.txt"]
    everything = await tree.glob("**")
    assert everything == sorted(everything)
    assert "/empty" in everything
    assert "/a/c" in everything


async def test_glob_relative_to_path(tree: corral.provider.FileSystem) -> None:
    assert await tree.glob("*.py", "/a") == ["/a/b.py"]
    assert await tree.glob("**/*.py", "a") == ["/a/b.py", "/a/c/d.py"]
    assert await tree.glob("?.py", "/a/c") == ["/a/c/d.py"]
    assert await tree.glob("[de].*", "/a/c") == ["/a/c/d.py", "/a/c/e.txt"]
    assert await tree.glob("*", "/empty") == []


async def test_glob_errors(tree: corral.provider.FileSystem) -> None:
    assert await _code(tree.glob("*", "/a.txt")) == "not_a_directory"
    assert await _code(tree.glob("*", "/nope")) == "not_found"
    assert await _code(tree.glob("")) == "invalid_argument"
    assert await _code(tree.glob("a\x00")) == "invalid_argument"
    assert await _code(tree.glob("*", "../x")) == "invalid_path"


async def test_grep_sorted_by_path_then_line(
    tree: corral.provider.FileSystem, compile_pattern: Compile
) -> None:
    result = await tree.grep(compile_pattern("alpha"), corral.provider.GrepOptions())
    assert [(m.path, m.line_number, m.line) for m in result.matches] == [
        ("/a.txt", 1, "alpha"),
        ("/a/b.py", 2, "print('alpha')"),
        ("/src/main.py", 1, "alpha = 2"),
        ("/src/main.py", 3, "alpha + beta"),
    ]
    assert not result.truncated
    assert result.skipped_paths == ()
    assert result.skipped_binary_paths == ()


async def test_grep_ignore_case_comes_from_the_matcher(
    tree: corral.provider.FileSystem, compile_pattern: Compile
) -> None:
    result = await tree.grep(
        compile_pattern("ALPHA", ignore_case=True), corral.provider.GrepOptions()
    )
    assert len(result.matches) == 4


async def test_grep_path_and_globs(
    tree: corral.provider.FileSystem, compile_pattern: Compile
) -> None:
    m = compile_pattern("alpha|beta|x")
    under_a = await tree.grep(m, corral.provider.GrepOptions(path="/a"))
    assert {x.path for x in under_a.matches} == {"/a/b.py", "/a/c/d.py", "/a/c/e.txt"}
    py = await tree.grep(m, corral.provider.GrepOptions(glob="*.py"))
    assert {x.path for x in py.matches} == {"/a/b.py", "/a/c/d.py", "/src/main.py"}
    # With a '/', the glob matches the path relative to options.path.
    rel = await tree.grep(m, corral.provider.GrepOptions(path="/a", glob="c/*.txt"))
    assert [x.path for x in rel.matches] == ["/a/c/e.txt"]
    none = await tree.grep(m, corral.provider.GrepOptions(glob="a/*.py"))
    assert [x.path for x in none.matches] == ["/a/b.py"]
    one_file = await tree.grep(m, corral.provider.GrepOptions(path="/src/main.py"))
    assert [x.line_number for x in one_file.matches] == [1, 2, 3]
    assert all(x.path == "/src/main.py" for x in one_file.matches)


async def test_grep_truncation_is_exact(
    tree: corral.provider.FileSystem, compile_pattern: Compile
) -> None:
    m = compile_pattern("alpha")
    cut = await tree.grep(m, corral.provider.GrepOptions(max_results=3))
    assert len(cut.matches) == 3
    assert cut.truncated
    full = await tree.grep(m, corral.provider.GrepOptions(max_results=4))
    assert len(full.matches) == 4
    assert not full.truncated
    # The cut falls between files: the next file's match still marks truncation.
    at_file_edge = await tree.grep(m, corral.provider.GrepOptions(max_results=2))
    assert [x.path for x in at_file_edge.matches] == ["/a.txt", "/a/b.py"]
    assert at_file_edge.truncated


async def test_grep_reports_binary_and_oversize_files(config: corral.ProviderConfig) -> None:
    provider = InMemoryProvider(max_grep_file_bytes=100)
    opened = await provider.open(config, corral.SessionRef("g"))
    fs = opened.workspace.fs
    assert fs is not None
    await fs.write_file("/bin.dat", b"needle\x00\x01")
    await fs.write_file("/late_nul.txt", b"n" * 8192 + b"\x00needle")
    await fs.write_file("/big.txt", b"needle\n" * 20)
    await fs.write_file("/ok.txt", b"needle\n")
    await fs.write_file("/bad_utf8.txt", b"\xffneedle\xfe\n")
    result = await fs.grep(
        corral.RegexModuleEngine().compile("needle"), corral.provider.GrepOptions(max_results=10)
    )
    assert result.skipped_binary_paths == ("/bin.dat",)
    assert result.skipped_paths == ("/big.txt", "/late_nul.txt")
    assert [(x.path, x.line) for x in result.matches] == [
        ("/bad_utf8.txt", "\ufffdneedle\ufffd"),
        ("/ok.txt", "needle"),
    ]
    await opened.workspace.close()


async def test_grep_errors(tree: corral.provider.FileSystem, compile_pattern: Compile) -> None:
    m = compile_pattern("x")
    assert await _code(tree.grep(m, corral.provider.GrepOptions(path="/nope"))) == "not_found"
    assert (
        await _code(tree.grep(m, corral.provider.GrepOptions(max_results=0))) == "invalid_argument"
    )
    assert await _code(tree.grep(m, corral.provider.GrepOptions(glob=""))) == "invalid_argument"
    assert await _code(tree.grep(m, corral.provider.GrepOptions(path="../.."))) == "invalid_path"
    assert await _code(tree.grep(m, {"path": "/"})) == "invalid_argument"  # type: ignore[arg-type]


class _TimingOutMatcher:
    """A structural matcher whose search runs out of time."""

    pattern = "slow"

    def search_lines(self, text: str, limit: int) -> list[tuple[int, str]]:
        raise corral.OperationError("pattern took too long", code="timeout")


async def test_grep_propagates_matcher_timeout(tree: corral.provider.FileSystem) -> None:
    assert await _code(tree.grep(_TimingOutMatcher(), corral.provider.GrepOptions())) == "timeout"


async def test_grep_over_many_files_lets_other_tasks_run(
    fs: corral.provider.FileSystem, compile_pattern: Compile
) -> None:
    for i in range(1500):
        await fs.write_file(f"/many/f{i:04}.txt", b"line of text\n" * 80)
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.lowlevel.checkpoint()
        start = ticks
        result = await fs.grep(compile_pattern("zzz"), corral.provider.GrepOptions())
        during = ticks - start
        done = True
    assert result.matches == ()
    assert during >= 5


async def test_grep_sniffs_only_the_first_8_kib(
    fs: corral.provider.FileSystem, compile_pattern: Compile
) -> None:
    await fs.write_file("/late.txt", b"n" * 8192 + b"\x00needle\n")
    await fs.write_file("/early.txt", b"n" * 8191 + b"\x00needle\n")
    result = await fs.grep(compile_pattern("needle"), corral.provider.GrepOptions())
    assert [x.path for x in result.matches] == ["/late.txt"]
    assert result.skipped_binary_paths == ("/early.txt",)
