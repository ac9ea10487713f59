"""``shell: true`` fits the provider's boundary: shell syntax where a kernel boundary
contains the command (local-sandbox, docker), the argv guard on local-bash."""

from __future__ import annotations

from pathlib import Path

import pytest

import corral

from ._real_providers import provider_options, require

pytestmark = pytest.mark.anyio

SYNTAX = {
    "pipe": ("printf 'a\\nb\\n' | wc -l", "2"),
    "variable": ("echo $GREETING", "hello"),
    "glob": ("ls *.py", "x.py"),
}


@pytest.fixture(params=["local-sandbox", "docker"])
def bounded_kind(request: pytest.FixtureRequest) -> str:
    require(str(request.param))
    return str(request.param)


@pytest.mark.parametrize("case", sorted(SYNTAX))
async def test_shell_syntax_is_allowed_by_default_inside_a_kernel_boundary(
    bounded_kind: str, tmp_path: Path, case: str
) -> None:
    command, expected = SYNTAX[case]
    async with corral.open_workspace(
        bounded_kind,
        {"fs": True, "shell": {"env": {"GREETING": "hello"}}},
        provider_options=provider_options(bounded_kind, tmp_path),
        raise_on_error=True,
    ) as ws:
        run = next(t for t in ws.tools if t.name == "workspace_run")
        assert "Shell syntax (pipes, redirects, globs) is allowed" in run.description
        await ws.call("workspace_write_file", {"path": "/x.py", "content": ""})
        result = await ws.call("workspace_run", {"command": command})
    assert result.data is not None
    assert result.data["stdout"].strip() == expected


async def test_the_user_can_still_turn_it_off(bounded_kind: str, tmp_path: Path) -> None:
    async with corral.open_workspace(
        bounded_kind,
        {"shell": {"allow_shell_syntax": False}},
        provider_options=provider_options(bounded_kind, tmp_path),
    ) as ws:
        result = await ws.call("workspace_run", {"command": "echo a | wc -l"})
    assert result.is_error
    assert result.error_code in ("policy_denied", "invalid_argument")


@pytest.mark.parametrize("case", sorted(SYNTAX))
async def test_local_bash_keeps_its_guard(tmp_path: Path, case: str) -> None:
    command, _ = SYNTAX[case]
    async with corral.open_workspace(
        "local-bash",
        {"shell": {"env": {"GREETING": "hello"}}},
        provider_options=provider_options("local-bash", tmp_path),
    ) as ws:
        result = await ws.call("workspace_run", {"command": command})
    assert result.is_error
    assert result.error_code in ("policy_denied", "invalid_argument")


def test_defaults_come_from_the_provider_spec_not_from_core() -> None:
    plugins = corral.default_plugins()
    for kind in ("local-sandbox", "docker"):
        # A contained box: shell syntax is not the risk there, for commands or processes.
        assert plugins.providers[kind].policy_defaults == {
            "shell": {"allow_shell_syntax": True},
            "process": {"allow_shell_syntax": True},
        }
    assert plugins.providers["local-bash"].policy_defaults == {}
