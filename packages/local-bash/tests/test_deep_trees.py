"""Deep trees (issue 11, item 8) and the here-document allowlist bypass (item 9)
against the real local-bash provider."""

from __future__ import annotations

from pathlib import Path

import pytest

import corral
from corral_conformance import deep_tree_scenario, heredoc_bypass_is_refused
from corral_local_bash import LocalBashProvider
from corral_posix import remove_tree

pytestmark = pytest.mark.anyio


async def test_deep_tree(tmp_path: Path) -> None:
    try:
        await deep_tree_scenario(
            LocalBashProvider(tmpdir_root=tmp_path), corral.ProviderConfig("local-bash")
        )
    finally:
        remove_tree(str(tmp_path))  # pytest's own cleanup would recurse on a failure's leftovers


async def test_heredoc_delimiter_with_a_blank_cannot_smuggle_a_command(tmp_path: Path) -> None:
    provider = LocalBashProvider(tmpdir_root=tmp_path)
    opened = await provider.open(corral.ProviderConfig("local-bash"), corral.SessionRef("h"))
    try:
        await heredoc_bypass_is_refused(opened.workspace)
    finally:
        await opened.workspace.close()
