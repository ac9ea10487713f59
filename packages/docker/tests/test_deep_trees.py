"""Deep trees (issue 11, item 8) and the here-document allowlist bypass (item 9)
against the real docker provider (local engine, bind-mounted workspace)."""

from __future__ import annotations

import pytest

import corral
from corral_conformance import deep_tree_scenario, heredoc_bypass_is_refused
from corral_docker import DockerProvider
from corral_posix import remove_tree

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


async def test_deep_tree(docker_ready: None, image: str, tmp_root: str) -> None:
    provider = DockerProvider(image=image, tmpdir_root=tmp_root)
    try:
        await deep_tree_scenario(provider, corral.ProviderConfig("docker"))
    finally:
        await provider.aclose()
        remove_tree(tmp_root)  # pytest's own cleanup would recurse on a failure's leftovers


async def test_heredoc_delimiter_with_a_blank_cannot_smuggle_a_command(
    docker_ready: None, image: str, tmp_root: str
) -> None:
    provider = DockerProvider(image=image, tmpdir_root=tmp_root)
    opened = await provider.open(corral.ProviderConfig("docker"), corral.SessionRef("h"))
    try:
        await heredoc_bypass_is_refused(opened.workspace)
    finally:
        await opened.workspace.close()
        await provider.aclose()
