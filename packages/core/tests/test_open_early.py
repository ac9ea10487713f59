"""Issue 17: opening fails early with the provider's advice; library users may ask to raise."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

import corral
from corral import (
    ConfigError,
    ProviderConfig,
    SessionRef,
    ToolCallError,
    WorkspaceFailedError,
    WorkspaceRef,
)
from corral.provider import OpenedWorkspace

pytestmark = pytest.mark.anyio

ADVICE = "bubblewrap (bwrap) is not on PATH; install it: apt install bubblewrap"


class CannotRunProvider:
    """A provider that cannot run on this machine, and says why."""

    provider_id: ClassVar[str] = "cannot-run"
    capabilities: ClassVar[frozenset[str]] = frozenset({"fs"})
    schema_version: ClassVar[int] = 1

    def __init__(self) -> None:
        self.opens = 0

    async def open(
        self, config: ProviderConfig, session: SessionRef, declared: frozenset[str] | None = None
    ) -> OpenedWorkspace:
        self.opens += 1
        raise WorkspaceFailedError(ADVICE, provider_id=self.provider_id)

    async def resolve(self, ref: WorkspaceRef) -> Any:
        raise WorkspaceFailedError(ADVICE, provider_id=self.provider_id)


@pytest.fixture
def plugins() -> corral.PluginSet:
    from corral_memory import _plugin as memory

    return corral.load_plugins([memory], entrypoints=False)


async def test_open_raises_with_the_providers_advice(plugins: corral.PluginSet) -> None:
    provider = CannotRunProvider()
    entered = False
    with pytest.raises(WorkspaceFailedError) as info:
        async with corral.open_workspace(provider, {"fs": True}, plugins=plugins):
            entered = True
    assert not entered
    assert info.value.message == ADVICE
    assert provider.opens == 1


async def test_lazy_opening_stays_available(plugins: corral.PluginSet) -> None:
    provider = CannotRunProvider()
    async with corral.open_workspace(
        provider, {"fs": True}, plugins=plugins, open_strategy="lazy"
    ) as ws:
        assert provider.opens == 0
        result = await ws.call("workspace_ls", {"path": "/"})
    assert result.is_error
    assert result.error_code == "workspace_failed"
    assert ADVICE in result.content


@pytest.mark.parametrize("capability", ["shell", "code", "script"])
async def test_a_capability_the_provider_cannot_populate_is_refused_before_any_tool(
    plugins: corral.PluginSet, capability: str
) -> None:
    with pytest.raises(ConfigError) as info:
        async with corral.open_workspace(
            "in-memory", {"fs": True, capability: True}, plugins=plugins, open_strategy="lazy"
        ):
            pytest.fail("tools were listed for a capability in-memory cannot populate")
    text = str(info.value)
    assert f"cannot populate capabilities: {capability}" in text
    assert "it supports: fs, snapshot" in text


async def test_a_switched_off_capability_is_not_checked(plugins: corral.PluginSet) -> None:
    async with corral.open_workspace(
        "in-memory", {"fs": True, "shell": False}, plugins=plugins
    ) as ws:
        assert "workspace_run" not in [t.name for t in ws.tools]


@pytest.mark.parametrize("capabilities", [["fs", "shell"], "fs", 1, {1: True}])
async def test_capabilities_that_are_not_a_mapping_of_names_are_a_clear_error(
    plugins: corral.PluginSet, capabilities: Any
) -> None:
    with pytest.raises(ConfigError, match="capabilit"):
        async with corral.open_workspace("in-memory", capabilities, plugins=plugins):
            pass


async def test_unknown_capability_names_the_known_ones(plugins: corral.PluginSet) -> None:
    with pytest.raises(ConfigError, match=r"unknown capability 'gti' \(known: code, fs,"):
        async with corral.open_workspace("in-memory", {"gti": True}, plugins=plugins):
            pass


async def test_open_strategy_is_checked(plugins: corral.PluginSet) -> None:
    with pytest.raises(ConfigError, match="open_strategy"):
        async with corral.open_workspace("in-memory", open_strategy="later", plugins=plugins):  # type: ignore[arg-type]
            pass


# -- raising for library users ---------------------------------------------------------


async def test_errors_are_results_by_default(plugins: corral.PluginSet) -> None:
    async with corral.open_workspace("in-memory", {"fs": True}, plugins=plugins) as ws:
        result = await ws.call("workspace_read_file", {"path": "/missing"})
    assert result.is_error
    assert result.error_code == "not_found"


async def test_raise_on_error_per_call(plugins: corral.PluginSet) -> None:
    async with corral.open_workspace("in-memory", {"fs": True}, plugins=plugins) as ws:
        with pytest.raises(ToolCallError) as info:
            await ws.call("workspace_read_file", {"path": "/missing"}, raise_on_error=True)
        ok = await ws.call("workspace_ls", {"path": "/"}, raise_on_error=True)
    assert info.value.code == "not_found"
    assert info.value.tool == "workspace_read_file"
    assert info.value.result.is_error
    assert "not_found" in str(info.value)
    assert not ok.is_error
    assert isinstance(info.value, corral.WorkspaceError)


async def test_raise_on_error_as_a_session_option(plugins: corral.PluginSet) -> None:
    async with corral.open_workspace(
        "in-memory", {"fs": True}, plugins=plugins, raise_on_error=True
    ) as ws:
        with pytest.raises(ToolCallError) as info:
            await ws.call("workspace_read_file", {"path": 5})
        assert info.value.code == "invalid_argument"
        # The model's path still gets results: a call may opt back out.
        result = await ws.call("workspace_read_file", {"path": "/x"}, raise_on_error=False)
        assert result.error_code == "not_found"
        # The tools themselves (what exporters and MCP serve) never raise.
        tool = next(t for t in ws.tools if t.name == "workspace_read_file")
        assert (await tool({"path": "/x"})).error_code == "not_found"
