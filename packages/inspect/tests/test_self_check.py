"""Inspect's own sandbox conformance checks, run against real corral providers.

Every check that fails by design is listed in ``KNOWN_FAILURES`` (and in the
README with its reason) and marked strict xfail: a regression fails the
suite, and so does a check that starts passing.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
from inspect_ai.util._sandbox.self_check import *  # noqa: F403 -- the checks are the tests

from corral_inspect import CorralSandboxEnvironment

from .conftest import provider_config, require

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

_ANY = frozenset({"local-sandbox", "docker"})

_OUTSIDE = "only the workspace persists between commands: writes outside it are refused"
_REPLACE = "corral writes replace a file atomically (rename), as its file tools do"
_AS_ROOT = "the file tools act with the host process's authority, which is root here"

KNOWN_FAILURES: dict[str, tuple[frozenset[str], str]] = {
    "test_read_and_write_file_including_directory_absolute": (_ANY, _OUTSIDE),
    "test_write_text_file_is_directory": (_ANY, _OUTSIDE),
    "test_write_binary_file_is_directory": (_ANY, _OUTSIDE),
    "test_cwd_absolute": (_ANY, _OUTSIDE),
    "test_write_text_file_without_permissions": (_ANY, _REPLACE),
    "test_write_binary_file_without_permissions": (_ANY, _REPLACE),
    "test_exec_as_user": (_ANY, "a corral workspace has one user: exec(user=...) is unsupported"),
    **({"test_read_file_not_allowed": (_ANY, _AS_ROOT)} if os.geteuid() == 0 else {}),
}
"""check name -> (providers it fails on, why); the README lists the same."""


@pytest.fixture(params=["local-sandbox", "docker"])
async def sandbox_env(request: pytest.FixtureRequest) -> AsyncIterator[CorralSandboxEnvironment]:
    kind: str = request.param
    marks = {"local-sandbox": pytest.mark.bwrap, "docker": pytest.mark.docker}
    request.applymarker(marks[kind])
    require(kind)
    known = KNOWN_FAILURES.get(request.node.originalname)
    if known is not None and kind in known[0]:
        request.applymarker(pytest.mark.xfail(reason=known[1], strict=True))
    env = await CorralSandboxEnvironment.open(
        CorralSandboxEnvironment.config_deserialize(provider_config(kind))
    )
    try:
        yield env
    finally:
        await env.close()


def test_known_failures_are_real_checks_listed_in_the_readme() -> None:
    from pathlib import Path

    from inspect_ai.util._sandbox import self_check

    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    for name in KNOWN_FAILURES:
        assert name in self_check.__all__, f"{name} is not an Inspect self-check"
        assert f"| `{name}`" in readme, f"{name} is not listed in the README"
