"""Property: the openat2 and walk resolvers agree on random trees and paths."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.provider import OperationError
from corral_posix import Resolver, open_beneath, openat2_available

NAMES = ("a", "b", "c")
COMPONENT = st.sampled_from([*NAMES, "..", ".", ""])


@st.composite
def link_targets(draw: st.DrawFn) -> str:
    kind = draw(
        st.sampled_from(["relative", "relative", "relative", "absolute_out", "absolute_in"])
    )
    if kind == "absolute_out":
        return "/etc/passwd"
    comps = draw(st.lists(COMPONENT, min_size=1, max_size=4))
    target = "/".join(comps) or "."
    return "/" + target if kind == "absolute_in" else target


def nodes(depth: int) -> st.SearchStrategy[dict[str, Any]]:
    leaf = st.one_of(
        st.just(("file",)),
        st.tuples(st.just("link"), link_targets()),
    )
    child = leaf if depth == 0 else st.one_of(leaf, st.tuples(st.just("dir"), nodes(depth - 1)))
    return st.dictionaries(st.sampled_from(NAMES), child, max_size=3)


def build(base: Path, tree: dict[str, Any]) -> None:
    for name, node in tree.items():
        path = base / name
        if node[0] == "file":
            path.write_text(name)
        elif node[0] == "link":
            path.symlink_to(node[1])
        else:
            path.mkdir()
            build(path, node[1])


def outcome(
    root_fd: int, parts: tuple[str, ...], flags: int, follow: bool, resolver: Resolver
) -> object:
    try:
        fd = open_beneath(root_fd, parts, flags, resolver=resolver, follow_leaf=follow)
    except OperationError as exc:
        return exc.code
    try:
        st_ = os.fstat(fd)
        return (st_.st_dev, st_.st_ino)
    finally:
        os.close(fd)


@pytest.mark.skipif(not openat2_available(), reason="openat2 is not available on this kernel")
@settings(max_examples=80, deadline=None)
@given(
    tree=nodes(2),
    paths=st.lists(st.lists(st.sampled_from(NAMES), max_size=4).map(tuple), min_size=1, max_size=8),
    flags=st.sampled_from(
        [os.O_RDONLY, os.O_PATH, os.O_RDONLY | os.O_DIRECTORY, os.O_PATH | os.O_DIRECTORY]
    ),
    follow=st.booleans(),
)
def test_resolvers_agree(
    tree: dict[str, Any], paths: list[tuple[str, ...]], flags: int, follow: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ws"
        root.mkdir()
        # The parent holds names the tree's links may climb to: escapes must not find them.
        for name in NAMES:
            (Path(tmp) / name).mkdir()
        build(root, tree)
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            inside = {(s.st_dev, s.st_ino) for s in _all_stats(root)}
            for parts in paths:
                kernel = outcome(root_fd, parts, flags, follow, "openat2")
                walked = outcome(root_fd, parts, flags, follow, "walk")
                assert kernel == walked, (parts, kernel, walked)
                if isinstance(kernel, tuple):
                    assert kernel in inside
        finally:
            os.close(root_fd)


def _all_stats(root: Path) -> list[os.stat_result]:
    out = [os.lstat(root)]
    for dirpath, dirnames, filenames in os.walk(root):
        out.extend(os.lstat(os.path.join(dirpath, n)) for n in dirnames + filenames)
    return out
