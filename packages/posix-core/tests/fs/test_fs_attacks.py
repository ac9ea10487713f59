"""The attack suite: traversal, symlink escapes, races, links and special files."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import TypeVar

import anyio
import pytest

from corral import RegexModuleEngine
from corral.provider import GrepOptions, OperationError, path_parts
from corral_posix import Resolver, TmpdirFileSystem, open_beneath

pytestmark = pytest.mark.anyio

T = TypeVar("T")

TRAVERSALS = [
    "..",
    "../..",
    "../outside/canary.txt",
    "/../outside/canary.txt",
    "a/../../outside/canary.txt",
    "a/../../../etc/passwd",
    "//..//outside//canary.txt",
    "./../outside/canary.txt",
    "x/./../../outside",
    "a\x00b",
    "/" + "a/" * 3000,
    "x" * 300,
    "bad\udcffname",
]


async def _code(awaitable: Awaitable[object]) -> str:
    with pytest.raises(OperationError) as info:
        await awaitable
    return info.value.code


async def _attempt(awaitable: Awaitable[T]) -> tuple[T | None, str | None]:
    try:
        return await awaitable, None
    except OperationError as exc:
        return None, exc.code


@pytest.mark.parametrize("path", TRAVERSALS)
async def test_traversal_spellings_are_invalid_everywhere(
    fs: TmpdirFileSystem, canary: Path, path: str
) -> None:
    engine = RegexModuleEngine()
    for call in (
        fs.read_file(path),
        fs.write_file(path, b"pwned"),
        fs.edit_file(path, "outside", "pwned"),
        fs.ls(path),
        fs.glob("*", path),
        fs.grep(engine.compile("canary"), GrepOptions(path=path)),
        fs.stat(path),
        fs.mkdir(path, parents=True),
        fs.rm(path, recursive=True),
    ):
        assert await _code(call) == "invalid_path"


async def test_encoded_looking_names_are_just_names(
    fs: TmpdirFileSystem, root: Path, canary: Path
) -> None:
    for name in ("%2e%2e", "..%2f..%2foutside", "..\\..\\outside", "...", "....//canary.txt"):
        await fs.write_file(name, b"inside")
        assert await fs.read_file(name) == b"inside"
    assert all(p.parent == root for p in root.rglob("*") if p.is_file() and p.name != "canary.txt")


@pytest.fixture
def escapes(root: Path, outside: Path) -> Path:
    (root / "d").mkdir()
    (root / "abs").symlink_to(outside / "canary.txt")
    (root / "absdir").symlink_to(outside)
    (root / "rel").symlink_to("../outside/canary.txt")
    (root / "reldir").symlink_to("../outside")
    (root / "d" / "deep").symlink_to("../../outside")
    (root / "up").symlink_to("..")
    (root / "passwd").symlink_to("/etc/passwd")
    (root / "loop").symlink_to("loop")
    (root / "magic").symlink_to("/proc/self/root/etc/passwd")
    return root


ESCAPE_PATHS = [
    "abs",
    "rel",
    "passwd",
    "magic",
    "absdir/canary.txt",
    "reldir/canary.txt",
    "d/deep/canary.txt",
    "up/outside/canary.txt",
    "loop",
    "loop/x",
]


@pytest.mark.parametrize("allow", [False, True])
@pytest.mark.parametrize("path", ESCAPE_PATHS)
async def test_symlink_escapes_at_every_position(
    escapes: Path, resolver: Resolver, canary: Path, outside: Path, allow: bool, path: str
) -> None:
    tfs = TmpdirFileSystem(escapes, resolver=resolver, allow_leaf_symlinks=allow)
    try:
        assert await _code(tfs.read_file(path)) == "invalid_path"
        assert await _code(tfs.edit_file(path, "canary", "pwned")) == "invalid_path"
        code = await _code(tfs.write_file(path, b"pwned"))
        assert code == "invalid_path"
        assert await _code(tfs.write_file(path + "/new", b"pwned")) == "invalid_path"
        assert await _code(tfs.mkdir(path + "/sub", parents=True)) == "invalid_path"
        assert await _code(tfs.ls(path)) in ("invalid_path", "not_a_directory")
    finally:
        tfs.close()
    assert sorted(p.name for p in outside.iterdir()) == ["canary.txt"]


async def test_rm_and_stat_act_on_the_link_itself(
    fs: TmpdirFileSystem, escapes: Path, canary: Path
) -> None:
    assert (await fs.stat("abs")).type == "symlink"
    assert (await fs.stat("absdir")).type == "symlink"
    assert await _code(fs.rm("absdir/canary.txt")) == "invalid_path"
    await fs.rm("abs")
    await fs.rm("absdir", recursive=True)
    assert not (escapes / "abs").is_symlink()
    assert not (escapes / "absdir").is_symlink()


async def test_rm_recursive_does_not_follow_symlinks(
    fs: TmpdirFileSystem, root: Path, outside: Path, canary: Path
) -> None:
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "out").symlink_to(outside)
    (root / "d" / "e" / "abs").symlink_to(outside / "canary.txt")
    await fs.rm("d", recursive=True)
    assert not (root / "d").exists()
    assert sorted(p.name for p in outside.iterdir()) == ["canary.txt"]


async def test_walks_never_follow_symlinks(
    fs: TmpdirFileSystem, escapes: Path, canary: Path
) -> None:
    (escapes / "d" / "self").symlink_to("..")
    (escapes / "d" / "f.txt").write_text("inside canary")
    found = await fs.glob("**")
    assert "/absdir" in found
    assert "/absdir/canary.txt" not in found
    assert not any(p.startswith(("/d/self/", "/up/")) for p in found)
    result = await fs.grep(RegexModuleEngine().compile("canary"), GrepOptions())
    assert [m.path for m in result.matches] == ["/d/f.txt"]
    entries = {e.name: e.type for e in await fs.ls("/")}
    assert entries["abs"] == "symlink"
    assert entries["loop"] == "symlink"


async def test_leaf_symlinks_inside_when_allowed(root: Path, resolver: Resolver) -> None:
    (root / "d").mkdir()
    (root / "d" / "real.txt").write_text("real")
    (root / "link").symlink_to("d/real.txt")
    (root / "dlink").symlink_to("d")
    strict = TmpdirFileSystem(root, resolver=resolver)
    loose = TmpdirFileSystem(root, resolver=resolver, allow_leaf_symlinks=True)
    try:
        assert await _code(strict.read_file("link")) == "invalid_path"
        assert await _code(strict.write_file("link", b"x")) == "invalid_path"
        assert await strict.read_file("dlink/real.txt") == b"real"  # not a leaf
        assert await loose.read_file("link") == b"real"
        await loose.write_file("link", b"through")
        assert (root / "link").is_symlink()
        assert (root / "d" / "real.txt").read_text() == "through"
        assert await loose.edit_file("link", "through", "edited") == 1
        assert (root / "d" / "real.txt").read_text() == "edited"
        assert [e.name for e in await loose.ls("dlink")] == ["real.txt"]
        assert (await loose.stat("link")).type == "symlink"
    finally:
        strict.close()
        loose.close()


@pytest.fixture
def swapper(root: Path, outside: Path) -> Iterator[None]:
    """A thread that flips ``root/sw`` between a real directory and a symlink to outside."""
    (root / "sw").mkdir()
    (root / "sw" / "canary.txt").write_bytes(b"inside\n")
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            try:
                os.rename(root / "sw", root / "parked")
                os.symlink(outside, root / "sw")
                time.sleep(0)
                os.unlink(root / "sw")
                os.rename(root / "parked", root / "sw")
            except OSError:
                # Our own writes may briefly hold the name; the flip resumes next round.
                time.sleep(0)

    thread = threading.Thread(target=flip, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(timeout=10)


async def test_symlink_swap_race_never_reaches_outside(
    fs: TmpdirFileSystem, root: Path, swapper: None, canary: Path, outside: Path
) -> None:
    engine = RegexModuleEngine()
    reads = 0
    allowed = {"not_found", "invalid_path", "not_a_directory", "is_a_directory"}
    reads = 0
    for i in range(300):
        data, code = await _attempt(fs.read_file("sw/canary.txt"))
        assert data != canary.read_bytes()
        assert code is None or code in allowed
        reads += data is not None
        _, code = await _attempt(fs.write_file("sw/canary.txt", b"written %d\n" % i))
        assert code is None or code in allowed
        result = await fs.grep(engine.compile("outside canary"), GrepOptions(path="/"))
        assert result.matches == ()
    assert reads > 0
    assert sorted(p.name for p in outside.iterdir()) == ["canary.txt"]


def test_open_beneath_swap_race(
    root: Path, root_fd: int, resolver: Resolver, swapper: None, canary: Path
) -> None:
    canary_ino = canary.stat().st_ino
    for _ in range(3000):
        for flags in (os.O_RDONLY, os.O_WRONLY | os.O_CREAT):
            try:
                fd = open_beneath(
                    root_fd, ("sw", "canary.txt"), flags, resolver=resolver, follow_leaf=True
                )
            except OperationError:
                continue
            try:
                assert os.fstat(fd).st_ino != canary_ino
            finally:
                os.close(fd)


async def test_hard_link_to_outside_is_not_modified(
    fs: TmpdirFileSystem, root: Path, outside: Path, canary: Path
) -> None:
    os.link(canary, root / "hl")
    os.link(canary, root / "hl2")
    await fs.write_file("hl", b"replaced")
    assert (root / "hl").read_bytes() == b"replaced"
    assert (root / "hl").stat().st_ino != canary.stat().st_ino
    assert await fs.edit_file("hl2", "canary", "pwned") == 1
    assert (root / "hl2").read_bytes() != canary.read_bytes()


async def test_fifo_is_refused_at_once(fs: TmpdirFileSystem, root: Path) -> None:
    os.mkfifo(root / "p")
    (root / "f.txt").write_text("text")
    with anyio.fail_after(5):
        assert await _code(fs.read_file("p")) == "unsupported_file_type"
        assert await _code(fs.write_file("p", b"x")) == "unsupported_file_type"
        assert await _code(fs.edit_file("p", "a", "b")) == "unsupported_file_type"
        result = await fs.grep(RegexModuleEngine().compile("text"), GrepOptions())
        assert [m.path for m in result.matches] == ["/f.txt"]
        single = await fs.grep(RegexModuleEngine().compile("x"), GrepOptions(path="p"))
        assert single.matches == ()
        assert single.skipped_paths == ("/p",)
    assert {e.name: e.type for e in await fs.ls()} == {"f.txt": "file", "p": "other"}
    assert stat.S_ISFIFO(os.lstat(root / "p").st_mode)


async def test_device_node_is_refused(fs: TmpdirFileSystem, root: Path) -> None:
    try:
        os.mknod(root / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError as exc:
        pytest.skip(f"mknod is not permitted here: {exc}")
    with anyio.fail_after(5):
        assert await _code(fs.read_file("null")) == "unsupported_file_type"
        assert await _code(fs.write_file("null", b"x")) == "unsupported_file_type"
    assert (await fs.stat("null")).type == "other"
    assert stat.S_ISCHR(os.lstat(root / "null").st_mode)


async def test_socket_is_refused(resolver: Resolver) -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.bind(os.path.join(short, "s"))
            tfs = TmpdirFileSystem(short, resolver=resolver)
            try:
                with anyio.fail_after(5):
                    assert await _code(tfs.read_file("s")) == "unsupported_file_type"
                    assert await _code(tfs.write_file("s", b"x")) == "unsupported_file_type"
                assert (await tfs.stat("s")).type == "other"
            finally:
                tfs.close()
        finally:
            sock.close()


async def test_sparse_ten_gib_file_is_refused_before_reading(
    fs: TmpdirFileSystem, root: Path
) -> None:
    with open(root / "sparse", "wb") as f:
        f.truncate(10 * 1024**3)
    start = time.monotonic()
    assert await _code(fs.read_file("sparse")) == "too_large"
    assert await _code(fs.edit_file("sparse", "a", "b")) == "too_large"
    result = await fs.grep(RegexModuleEngine().compile("x"), GrepOptions())
    assert result.skipped_paths == ("/sparse",)
    assert time.monotonic() - start < 2.0


async def test_size_cap_is_exact(root: Path, resolver: Resolver) -> None:
    (root / "ten").write_bytes(b"x" * 10)
    (root / "eleven").write_bytes(b"x" * 11)
    tfs = TmpdirFileSystem(root, resolver=resolver, max_file_bytes=10)
    try:
        assert await tfs.read_file("ten") == b"x" * 10
        assert await _code(tfs.read_file("eleven")) == "too_large"
    finally:
        tfs.close()


async def test_catastrophic_regex_times_out(fs: TmpdirFileSystem, root: Path) -> None:
    (root / "evil.txt").write_text("a" * 20_000 + "b\n")
    matcher = RegexModuleEngine(timeout_s=0.2, refuse_catastrophic=False).compile("(a+)+$")
    start = time.monotonic()
    with anyio.fail_after(10):
        assert await _code(fs.grep(matcher, GrepOptions())) == "timeout"
    assert time.monotonic() - start < 5


async def test_binary_files_are_reported(fs: TmpdirFileSystem, root: Path) -> None:
    (root / "bin.dat").write_bytes(b"match\x00\x01")
    (root / "late.dat").write_bytes(b"match" + b"x" * 9000 + b"\x00")
    (root / "t.txt").write_text("match")
    result = await fs.grep(RegexModuleEngine().compile("match"), GrepOptions())
    assert result.skipped_binary_paths == ("/bin.dat",)
    assert [m.path for m in result.matches] == ["/late.dat", "/t.txt"]


def _deep(root: Path, depth: int) -> None:
    path = root
    for i in range(depth):
        path = path / f"l{i}"
    path.mkdir(parents=True)
    (path / "bottom.txt").write_text("needle")


async def test_walk_caps_are_reported(root: Path, resolver: Resolver) -> None:
    for i in range(10):
        (root / f"f{i}.txt").write_text("needle")
    capped = TmpdirFileSystem(root, resolver=resolver, max_walk_entries=5)
    try:
        assert await _code(capped.glob("*")) == "too_large"
        assert await _code(capped.ls("/")) == "too_large"
        result = await capped.grep(RegexModuleEngine().compile("needle"), GrepOptions())
        assert len(result.matches) == 5
        assert result.skipped_paths == ("/",)
    finally:
        capped.close()


async def test_walk_depth_cap_is_reported(root: Path, resolver: Resolver) -> None:
    _deep(root, 6)
    shallow = TmpdirFileSystem(root, resolver=resolver, max_walk_depth=3)
    try:
        result = await shallow.grep(RegexModuleEngine().compile("needle"), GrepOptions())
        assert result.matches == ()
        assert result.skipped_paths == ("/l0/l1/l2",)
        assert await _code(shallow.glob("**/*.txt")) == "too_large"
        assert await shallow.glob("l0/*") == ["/l0/l1"]
        deep = await shallow.grep(
            RegexModuleEngine().compile("needle"), GrepOptions(path="/l0/l1/l2/l3/l4")
        )
        assert [m.path for m in deep.matches] == ["/l0/l1/l2/l3/l4/l5/bottom.txt"]
    finally:
        shallow.close()


async def test_walk_terminates_on_a_bind_mount_loop(fs: TmpdirFileSystem, root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "f.txt").write_text("needle")
    target = root / "a" / "b"
    if os.system(f"mount --bind {root / 'a'} {target} 2>/dev/null") != 0:
        pytest.skip("bind mounts are not permitted here")
    try:
        with anyio.fail_after(20):
            result = await fs.grep(RegexModuleEngine().compile("needle"), GrepOptions())
            found = await fs.glob("**/*.txt")
        assert [m.path for m in result.matches] == ["/a/f.txt"]
        assert result.skipped_paths == ("/a/b",)
        assert found == ["/a/f.txt"]
    finally:
        os.system(f"umount {target}")


def test_path_parts_and_open_beneath_agree_on_the_root(root_fd: int, resolver: Resolver) -> None:
    fd = open_beneath(root_fd, path_parts("/a/.."), os.O_RDONLY, resolver=resolver)
    os.close(fd)
