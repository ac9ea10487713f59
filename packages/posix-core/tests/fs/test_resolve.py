"""open_beneath: confinement, symlink policy and error codes, on both resolvers."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from corral.provider import OperationError, path_parts
from corral_posix import Resolver, _resolve, open_beneath

RD = os.O_RDONLY


def _ino(fd: int) -> tuple[int, int]:
    try:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


def _code(root_fd: int, path: str, resolver: Resolver, flags: int = RD, **kw: bool) -> str:
    with pytest.raises(OperationError) as info:
        os.close(open_beneath(root_fd, path_parts(path), flags, resolver=resolver, **kw))
    return info.value.code


@pytest.fixture
def tree(root: Path, outside: Path) -> Path:
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "f.txt").write_text("f")
    (root / "top.txt").write_text("top")
    (root / "d" / "e" / "up").symlink_to("../f.txt")  # stays inside
    (root / "d" / "e" / "updir").symlink_to("..")
    (root / "rootlink").symlink_to(".")
    (root / "abs").symlink_to(outside / "canary.txt")
    (root / "absdir").symlink_to(outside)
    (root / "passwd").symlink_to("/etc/passwd")
    (root / "climb").symlink_to("../outside/canary.txt")
    (root / "d" / "climb2").symlink_to("../../outside")
    (root / "loop1").symlink_to("loop2")
    (root / "loop2").symlink_to("loop1")
    (root / "self").symlink_to("self")
    (root / "dangling").symlink_to("missing")
    (root / "magic").symlink_to("/proc/self/root/etc/passwd")
    (root / "trail").symlink_to("top.txt/")
    return root


def test_opens_plain_paths_and_the_root(tree: Path, root_fd: int, resolver: Resolver) -> None:
    fd = open_beneath(root_fd, ("d", "f.txt"), RD, resolver=resolver)
    assert _ino(fd) == (os.stat(tree / "d/f.txt").st_dev, os.stat(tree / "d/f.txt").st_ino)
    root_st = os.stat(tree)
    assert _ino(open_beneath(root_fd, (), RD, resolver=resolver)) == (
        root_st.st_dev,
        root_st.st_ino,
    )


def test_result_is_cloexec(tree: Path, root_fd: int, resolver: Resolver) -> None:
    fd = open_beneath(root_fd, ("top.txt",), RD, resolver=resolver)
    try:
        assert not os.get_inheritable(fd)
    finally:
        os.close(fd)


def test_inner_symlinks_are_followed_in_the_middle(
    tree: Path, root_fd: int, resolver: Resolver
) -> None:
    fd = open_beneath(root_fd, ("rootlink", "d", "e", "updir", "f.txt"), RD, resolver=resolver)
    assert _ino(fd)[1] == os.stat(tree / "d/f.txt").st_ino


def test_leaf_symlink_refused_unless_followed(tree: Path, root_fd: int, resolver: Resolver) -> None:
    assert _code(root_fd, "d/e/up", resolver) == "invalid_path"
    fd = open_beneath(root_fd, ("d", "e", "up"), RD, resolver=resolver, follow_leaf=True)
    assert _ino(fd)[1] == os.stat(tree / "d/f.txt").st_ino


def test_o_path_opens_the_link_itself(tree: Path, root_fd: int, resolver: Resolver) -> None:
    fd = open_beneath(root_fd, ("abs",), os.O_PATH, resolver=resolver)
    assert _ino(fd)[1] == os.lstat(tree / "abs").st_ino


@pytest.mark.parametrize(
    "path",
    ["abs", "absdir/canary.txt", "passwd", "climb", "d/climb2/canary.txt", "magic", "rootlink/abs"],
)
def test_escaping_symlinks_are_refused_at_every_position(
    tree: Path, root_fd: int, resolver: Resolver, path: str
) -> None:
    assert _code(root_fd, path, resolver, follow_leaf=True) == "invalid_path"
    assert _code(root_fd, path, resolver) == "invalid_path"


@pytest.mark.parametrize("path", ["loop1", "self", "loop1/x", "self/x"])
def test_symlink_loops_end_with_invalid_path(
    tree: Path, root_fd: int, resolver: Resolver, path: str
) -> None:
    assert _code(root_fd, path, resolver, follow_leaf=True) == "invalid_path"


def test_error_codes(tree: Path, root_fd: int, resolver: Resolver) -> None:
    assert _code(root_fd, "missing", resolver) == "not_found"
    assert _code(root_fd, "d/missing/x", resolver) == "not_found"
    assert _code(root_fd, "dangling", resolver, follow_leaf=True) == "not_found"
    assert _code(root_fd, "top.txt/x", resolver) == "not_a_directory"
    assert _code(root_fd, "top.txt", resolver, os.O_RDONLY | os.O_DIRECTORY) == "not_a_directory"
    assert _code(root_fd, "trail", resolver, follow_leaf=True) == "not_a_directory"
    assert _code(root_fd, "d", resolver, os.O_WRONLY) == "is_a_directory"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    assert _code(root_fd, "top.txt", resolver, flags) == "exists"


def test_create_beneath(tree: Path, root_fd: int, resolver: Resolver) -> None:
    fd = open_beneath(
        root_fd, ("d", "new.txt"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640, resolver=resolver
    )
    os.close(fd)
    assert (tree / "d/new.txt").stat().st_mode & 0o777 == 0o640 & ~_umask()


def _umask() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    return 0o022


def test_create_through_an_escaping_symlink_is_refused(
    tree: Path, root_fd: int, resolver: Resolver, outside: Path
) -> None:
    (tree / "newout").symlink_to(outside / "created.txt")
    flags = os.O_WRONLY | os.O_CREAT
    assert _code(root_fd, "newout", resolver, flags, follow_leaf=True) == "invalid_path"
    assert _code(root_fd, "absdir/created.txt", resolver, flags) == "invalid_path"
    assert not (outside / "created.txt").exists()


def test_auto_falls_back_to_the_walk_on_enosys(
    tree: Path, root_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def refused(*args: object) -> int:
        calls.append(1)
        return -errno.ENOSYS

    monkeypatch.setattr(_resolve, "openat2_available", lambda: True)
    monkeypatch.setattr(_resolve, "_raw_openat2", refused)
    fd = open_beneath(root_fd, ("d", "f.txt"), RD)
    assert _ino(fd)[1] == os.stat(tree / "d/f.txt").st_ino
    assert calls == [1]
    with pytest.raises(OperationError) as info:
        open_beneath(root_fd, ("d", "f.txt"), RD, resolver="openat2")
    assert info.value.code == "unsupported"


def test_eagain_is_retried_then_the_walk_answers(
    tree: Path, root_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _resolve.openat2_available():  # probe before patching: the answer is cached
        pytest.skip("openat2 is not available")
    real = _resolve._raw_openat2
    results = iter([-errno.EAGAIN, -errno.EAGAIN])

    def flaky(*args: int | bytes) -> int:
        return next(results, None) or real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(_resolve, "_raw_openat2", flaky)
    fd = open_beneath(root_fd, ("top.txt",), RD, resolver="openat2")
    assert _ino(fd)[1] == os.stat(tree / "top.txt").st_ino
    monkeypatch.setattr(_resolve, "_raw_openat2", lambda *a: -errno.EAGAIN)
    fd = open_beneath(root_fd, ("top.txt",), RD)
    assert _ino(fd)[1] == os.stat(tree / "top.txt").st_ino


def test_eperm_falls_back_only_in_auto(
    tree: Path, root_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _resolve.openat2_available():  # probe before patching: the answer is cached
        pytest.skip("openat2 is not available")
    monkeypatch.setattr(_resolve, "_raw_openat2", lambda *a: -errno.EPERM)
    os.close(open_beneath(root_fd, ("top.txt",), RD))
    with pytest.raises(OperationError) as info:
        open_beneath(root_fd, ("top.txt",), RD, resolver="openat2")
    assert info.value.code == "permission_denied"


def test_walk_never_needs_more_than_forty_links(tree: Path, root_fd: int) -> None:
    chain = tree / "chain"
    chain.mkdir()
    (chain / "l0").write_text("end")
    for i in range(1, 42):
        (chain / f"l{i}").symlink_to(f"l{i - 1}")
    for resolver in ("walk", "openat2"):
        if resolver == "openat2" and not _resolve.openat2_available():
            continue
        os.close(open_beneath(root_fd, ("chain", "l40"), RD, resolver=resolver, follow_leaf=True))
        assert _code(root_fd, "chain/l41", resolver, follow_leaf=True) == "invalid_path"
