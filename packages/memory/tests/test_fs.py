"""FileSystem semantics of the in-memory provider: every method and error code."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
import pytest

import corral
import corral.provider

pytestmark = pytest.mark.anyio


async def code_of(awaitable: object) -> str:
    """The OperationError code an awaitable raises."""
    with pytest.raises(corral.OperationError) as info:
        await awaitable  # type: ignore[misc]
    return info.value.code


async def test_write_creates_parents_and_reads_back(fs: corral.provider.FileSystem) -> None:
    await fs.write_file("/a/b/c.txt", b"hello")
    assert await fs.read_file("a/b/c.txt") == b"hello"
    assert (await fs.stat("/a")).type == "dir"
    assert (await fs.stat("/a/b")).type == "dir"
    await fs.write_file("/a/b/c.txt", b"bye")
    assert await fs.read_file("/a/./b/../b/c.txt") == b"bye"


async def test_write_accepts_bytes_like_and_refuses_text(fs: corral.provider.FileSystem) -> None:
    await fs.write_file("/x", bytearray(b"ab"))  # type: ignore[arg-type]
    await fs.write_file("/y", memoryview(b"cd"))  # type: ignore[arg-type]
    assert await fs.read_file("/x") == b"ab"
    assert await fs.read_file("/y") == b"cd"
    assert await code_of(fs.write_file("/z", "text")) == "invalid_argument"  # type: ignore[arg-type]


async def test_write_errors(fs: corral.provider.FileSystem) -> None:
    await fs.mkdir("/d")
    await fs.write_file("/f", b"x")
    assert await code_of(fs.write_file("/d", b"x")) == "is_a_directory"
    assert await code_of(fs.write_file("/", b"x")) == "is_a_directory"
    assert await code_of(fs.write_file("/f/g", b"x")) == "not_a_directory"
    assert await code_of(fs.write_file("/f/g/h", b"x")) == "not_a_directory"
    assert await fs.read_file("/f") == b"x"


async def test_failed_write_leaves_no_parents(fs: corral.provider.FileSystem) -> None:
    await fs.write_file("/p/file", b"x")
    assert await code_of(fs.write_file("/p/file/q/r", b"x")) == "not_a_directory"
    assert [e.name for e in await fs.ls("/p")] == ["file"]


@pytest.mark.parametrize("bad", ["../x", "/a/../../x", "a\x00b", "/" + "a" * 256, "x/" * 2100])
async def test_invalid_paths(fs: corral.provider.FileSystem, bad: str) -> None:
    assert await code_of(fs.write_file(bad, b"x")) == "invalid_path"
    assert await code_of(fs.read_file(bad)) == "invalid_path"
    assert await code_of(fs.stat(bad)) == "invalid_path"
    assert await code_of(fs.ls(bad)) == "invalid_path"


async def test_read_errors(fs: corral.provider.FileSystem) -> None:
    await fs.write_file("/f", b"x")
    await fs.mkdir("/d")
    assert await code_of(fs.read_file("/missing")) == "not_found"
    assert await code_of(fs.read_file("/d/missing")) == "not_found"
    assert await code_of(fs.read_file("/d")) == "is_a_directory"
    assert await code_of(fs.read_file("/")) == "is_a_directory"
    assert await code_of(fs.read_file("/f/x")) == "not_a_directory"


async def test_edit_replaces_once(fs: corral.provider.FileSystem) -> None:
    await fs.write_file("/t.txt", "héllo wörld\n".encode())
    assert await fs.edit_file("/t.txt", "wörld", "there") == 1
    assert await fs.read_file("/t.txt") == "héllo there\n".encode()


async def test_edit_replace_all_counts(fs: corral.provider.FileSystem) -> None:
    await fs.write_file("/t.txt", b"a-a-a")
    assert await code_of(fs.edit_file("/t.txt", "a", "b")) == "not_unique"
    assert await fs.read_file("/t.txt") == b"a-a-a"
    assert await fs.edit_file("/t.txt", "a", "bb", replace_all=True) == 3
    assert await fs.read_file("/t.txt") == b"bb-bb-bb"


async def test_edit_errors(fs: corral.provider.FileSystem) -> None:
    await fs.write_file("/t.txt", b"abc")
    await fs.write_file("/bin", b"\xff\xfe\x00")
    await fs.mkdir("/d")
    assert await code_of(fs.edit_file("/t.txt", "zzz", "y")) == "no_match"
    assert await code_of(fs.edit_file("/t.txt", "", "y")) == "invalid_argument"
    assert await code_of(fs.edit_file("/bin", "a", "b")) == "unsupported_file_type"
    assert await code_of(fs.edit_file("/missing", "a", "b")) == "not_found"
    assert await code_of(fs.edit_file("/d", "a", "b")) == "is_a_directory"
    assert await code_of(fs.edit_file("/t.txt", "a", "\ud800")) == "invalid_argument"
    assert await fs.read_file("/t.txt") == b"abc"


async def test_ls_sorted_with_types_and_sizes(fs: corral.provider.FileSystem) -> None:
    await fs.write_file("/d/zeta", b"12345")
    await fs.write_file("/d/alpha", b"")
    await fs.mkdir("/d/mid")
    entries = await fs.ls("/d")
    assert entries == [
        corral.FileEntry(name="alpha", path="/d/alpha", type="file", size=0),
        corral.FileEntry(name="mid", path="/d/mid", type="dir", size=0),
        corral.FileEntry(name="zeta", path="/d/zeta", type="file", size=5),
    ]
    assert [e.path for e in await fs.ls("/")] == ["/d"]
    assert [e.path for e in await fs.ls()] == ["/d"]


async def test_ls_errors(fs: corral.provider.FileSystem) -> None:
    await fs.write_file("/f", b"x")
    assert await code_of(fs.ls("/f")) == "not_a_directory"
    assert await code_of(fs.ls("/nope")) == "not_found"


async def test_stat(fs: corral.provider.FileSystem) -> None:
    before = time.time()
    await fs.write_file("/a/f.txt", b"abc")
    st = await fs.stat("a//f.txt")
    assert (st.path, st.type, st.size, st.mode) == ("/a/f.txt", "file", 3, 0o644)
    assert before <= st.mtime <= time.time()
    d = await fs.stat("/a/")
    assert (d.path, d.type, d.mode) == ("/a", "dir", 0o755)
    root = await fs.stat("/")
    assert (root.path, root.type) == ("/", "dir")
    assert await code_of(fs.stat("/missing")) == "not_found"
    assert await code_of(fs.stat("/a/f.txt/x")) == "not_a_directory"


async def test_overwrite_keeps_mode_and_updates_mtime(fs: corral.provider.FileSystem) -> None:
    await fs.write_file("/f", b"1")
    first = (await fs.stat("/f")).mtime
    await anyio.sleep(0.01)
    await fs.write_file("/f", b"22")
    st = await fs.stat("/f")
    assert st.mtime > first
    assert st.size == 2


async def test_mkdir(fs: corral.provider.FileSystem) -> None:
    await fs.mkdir("/a")
    assert await fs.ls("/a") == []
    assert await code_of(fs.mkdir("/a")) == "exists"
    await fs.mkdir("/a", parents=True)
    await fs.mkdir("/x/y/z", parents=True)
    assert (await fs.stat("/x/y/z")).type == "dir"
    assert await code_of(fs.mkdir("/m/n")) == "not_found"
    assert await code_of(fs.stat("/m")) == "not_found"
    await fs.write_file("/f", b"x")
    assert await code_of(fs.mkdir("/f")) == "exists"
    assert await code_of(fs.mkdir("/f", parents=True)) == "exists"
    assert await code_of(fs.mkdir("/f/g")) == "not_a_directory"
    assert await code_of(fs.mkdir("/f/g/h", parents=True)) == "not_a_directory"
    assert await code_of(fs.mkdir("/")) == "exists"
    await fs.mkdir("/", parents=True)


async def test_rm(fs: corral.provider.FileSystem) -> None:
    await fs.write_file("/d/sub/f", b"x")
    await fs.write_file("/g", b"y")
    await fs.mkdir("/empty")
    await fs.rm("/g")
    assert await code_of(fs.read_file("/g")) == "not_found"
    await fs.rm("/empty")
    assert await code_of(fs.rm("/d")) == "not_empty"
    assert await fs.read_file("/d/sub/f") == b"x"
    await fs.rm("/d", recursive=True)
    assert await fs.ls("/") == []
    assert await code_of(fs.rm("/d")) == "not_found"
    assert await code_of(fs.rm("/")) == "invalid_argument"
    assert await code_of(fs.rm("/", recursive=True)) == "invalid_argument"


async def test_rm_returns_budget(
    opened: corral.provider.OpenedWorkspace, fs: corral.provider.FileSystem
) -> None:
    details = corral.provider.describe_workspace
    await fs.write_file("/a/b/c", b"x" * 1000)
    await fs.write_file("/a/d", b"y" * 10)
    assert details(opened.workspace)["file_bytes"] == 1010
    await fs.rm("/a", recursive=True)
    assert details(opened.workspace)["used_bytes"] == 0
    assert details(opened.workspace)["file_bytes"] == 0


async def test_deep_tree_has_no_recursion_limit(
    fs: corral.provider.FileSystem, snap: corral.provider.Snapshotter
) -> None:
    deep = "/".join(["d"] * 1800)
    await fs.write_file(deep + "/leaf", b"bottom")
    assert len(await fs.glob("**/leaf")) == 1
    info = await snap.snapshot()
    await fs.rm("/d", recursive=True)
    await snap.restore(info.snapshot_id)
    assert await fs.read_file(deep + "/leaf") == b"bottom"


async def test_every_call_after_close_is_closed(opened: corral.provider.OpenedWorkspace) -> None:
    ws = opened.workspace
    fs, snap = ws.fs, ws.snapshot
    assert fs is not None
    assert snap is not None
    await fs.write_file("/f", b"x")
    await ws.close()
    await ws.close()
    m = corral.RegexModuleEngine().compile("x")
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: fs.read_file("/f"),
        lambda: fs.write_file("/f", b"y"),
        lambda: fs.edit_file("/f", "x", "y"),
        lambda: fs.ls("/"),
        lambda: fs.glob("*"),
        lambda: fs.grep(m, corral.provider.GrepOptions()),
        lambda: fs.stat("/f"),
        lambda: fs.mkdir("/d"),
        lambda: fs.rm("/f"),
        snap.snapshot,
        snap.list,
        lambda: snap.restore("snap-x"),
        lambda: snap.delete("snap-x"),
        lambda: snap.branch("snap-x"),
    ]
    for call in calls:
        assert await code_of(call()) == "closed"


async def test_concurrent_writers_and_readers_stay_consistent(
    fs: corral.provider.FileSystem,
) -> None:
    m = corral.RegexModuleEngine().compile("payload")

    async def writer(n: int) -> None:
        for i in range(30):
            await fs.write_file(f"/w{n}/f{i}", b"payload " * (i + 1))
            await fs.edit_file(f"/w{n}/f{i}", "payload", "PAYLOAD", replace_all=True)

    async def churn() -> None:
        for _ in range(30):
            await fs.mkdir("/tmp/x", parents=True)
            await fs.rm("/tmp", recursive=True)

    async def searcher() -> None:
        for _ in range(30):
            await fs.grep(m, corral.provider.GrepOptions())
            await fs.glob("**")

    async with anyio.create_task_group() as tg:
        for n in range(4):
            tg.start_soon(writer, n)
        tg.start_soon(churn)
        tg.start_soon(searcher)
    for n in range(4):
        for i in range(30):
            assert await fs.read_file(f"/w{n}/f{i}") == b"PAYLOAD " * (i + 1)
    assert (await fs.grep(m, corral.provider.GrepOptions())).matches == ()
