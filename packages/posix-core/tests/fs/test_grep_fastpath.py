"""grep's lean per-file path (bytes prefilter, no path parsing) agrees with the slow one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

import corral
import corral.provider
from corral.testing import LinesOnlyMatcher
from corral_posix._fileops import FsConfig
from corral_posix._walk import grep_tree

_CHUNKS = [
    b"needle_1",
    b"ab",
    b"\xc3\xa9",
    b"\xe2\x84\xaa",
    b"\r\n",
    b"\n",
    b"\x00",
    b"\xff",
    b"k",
    b" ",
]
_PATTERNS = ["needle_[0-9]+", "ab", "é", "a.b", "^$", r"\w+_1", "k", r"b\r?$"]

contents = st.lists(st.sampled_from(_CHUNKS), max_size=20).map(b"".join)


@settings(max_examples=60, deadline=None)
@given(
    files=st.dictionaries(st.sampled_from(["a", "b/c", "b/d", "e"]), contents, max_size=4),
    pattern=st.sampled_from(_PATTERNS),
    ignore_case=st.booleans(),
    limit=st.integers(1, 5),
    cap=st.sampled_from([8, 1 << 20]),
)
def test_fast_and_slow_grep_agree(
    files: dict[str, bytes], pattern: str, ignore_case: bool, limit: int, cap: int
) -> None:
    matcher = corral.RegexModuleEngine().compile(pattern, ignore_case=ignore_case)
    cfg = FsConfig(max_file_bytes=cap)
    options = corral.provider.GrepOptions(max_results=limit)
    with tempfile.TemporaryDirectory() as tmp:
        for rel, data in files.items():
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / rel).write_bytes(data)
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fast = grep_tree(fd, matcher, options, cfg)
            slow = grep_tree(fd, LinesOnlyMatcher(matcher), options, cfg)
        finally:
            os.close(fd)
    assert fast == slow
    big = {f"/{p}" for p, d in files.items() if len(d) > cap}
    binary = {f"/{p}" for p, d in files.items() if corral.provider.is_binary(d)} - big
    if not fast.truncated:
        assert set(fast.skipped_paths) == big
        assert set(fast.skipped_binary_paths) == binary
        expected = 0
        for p, d in files.items():
            if f"/{p}" in big | binary:
                continue
            text = d.decode("utf-8", errors="replace")
            expected += len(matcher.search_lines(text, 100))
        assert len(fast.matches) == expected


def test_lean_reader_reads_whole_files_within_the_cap(tmp_path: Path) -> None:
    matcher = corral.RegexModuleEngine().compile("needle")
    (tmp_path / "f").write_bytes(b"x\n" * 10 + b"needle\n")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        found = grep_tree(
            fd, matcher, corral.provider.GrepOptions(), FsConfig(max_file_bytes=1 << 20)
        )
        small_cap = grep_tree(
            fd, matcher, corral.provider.GrepOptions(), FsConfig(max_file_bytes=10)
        )
    finally:
        os.close(fd)
    assert [(m.path, m.line_number) for m in found.matches] == [("/f", 11)]
    assert small_cap.matches == ()
    assert small_cap.skipped_paths == ("/f",)
