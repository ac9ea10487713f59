"""Fixtures for the TmpdirFileSystem and open_beneath tests: a workspace root
beside an "outside" directory holding a canary that must never be read or written."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral_posix import Resolver, TmpdirFileSystem, openat2_available

CANARY = b"outside canary: must never be read or changed\n"


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest) -> Resolver:
    """Both resolvers; openat2 is required on Linux >= 5.6 (this suite's floor)."""
    name: Resolver = request.param
    if name == "openat2" and not openat2_available():
        if os.environ.get("CORRAL_REQUIRE_OPENAT2") == "1":
            pytest.fail("openat2 is required but not available")
        pytest.skip("openat2 is not available on this kernel")
    return name


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the workspace, with a canary file."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "canary.txt").write_bytes(CANARY)
    return path


@pytest.fixture
def root(tmp_path: Path, outside: Path) -> Path:
    """The workspace root (a sibling of ``outside``)."""
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def root_fd(root: Path) -> Iterator[int]:
    """An O_DIRECTORY fd of the workspace root."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    yield fd
    os.close(fd)


@pytest.fixture
def fs(root: Path, resolver: Resolver) -> Iterator[TmpdirFileSystem]:
    """A file system over ``root`` with the parametrised resolver."""
    tfs = TmpdirFileSystem(root, resolver=resolver, provider_id="test")
    yield tfs
    tfs.close()


@pytest.fixture
def canary(outside: Path) -> Iterator[Path]:
    """The canary path; the test fails if its content or inode changed."""
    path = outside / "canary.txt"
    before = path.stat()
    yield path
    after = path.stat()
    assert path.read_bytes() == CANARY
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
