"""grep through the matcher's bytes fast path agrees with decoding every file."""

from __future__ import annotations

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

import corral
import corral.provider
from corral.testing import LinesOnlyMatcher
from corral_memory import InMemoryProvider

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


async def _grep_both(
    files: dict[str, bytes], matcher: corral.provider.Matcher, limit: int
) -> tuple[corral.GrepResult, corral.GrepResult]:
    opened = await InMemoryProvider().open(
        corral.ProviderConfig(kind="in-memory"), corral.SessionRef(session_id="s")
    )
    try:
        fs = opened.workspace.fs
        assert fs is not None
        for path, data in files.items():
            await fs.write_file(path, data)
        options = corral.provider.GrepOptions(max_results=limit)
        fast = await fs.grep(matcher, options)
        slow = await fs.grep(LinesOnlyMatcher(matcher), options)
    finally:
        await opened.workspace.close()
    return fast, slow


@settings(max_examples=60, deadline=None)
@given(
    files=st.dictionaries(st.sampled_from(["/a", "/b/c", "/b/d", "/e"]), contents, max_size=4),
    pattern=st.sampled_from(_PATTERNS),
    ignore_case=st.booleans(),
    limit=st.integers(1, 5),
)
def test_fast_and_slow_grep_agree(
    files: dict[str, bytes], pattern: str, ignore_case: bool, limit: int
) -> None:
    matcher = corral.RegexModuleEngine().compile(pattern, ignore_case=ignore_case)
    fast, slow = anyio.run(_grep_both, files, matcher, limit)
    assert fast == slow
    if not fast.truncated:  # a cut search stops before the files after the cut
        binary = {p for p, d in files.items() if corral.provider.is_binary(d)}
        assert set(fast.skipped_binary_paths) == binary
