"""The plugin system: third-party capabilities, blocking, loud failures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest

import corral
from corral import Capability, SessionRef, ToolSpec, WorkspaceRegistry, WorkspaceToolset

pytestmark = pytest.mark.anyio


@attrs.frozen(kw_only=True)
class GitPolicy:
    allow_push: bool = False


class FakeGit:
    def __init__(self) -> None:
        self.log: list[str] = ["initial commit"]

    async def commits(self) -> list[str]:
        return list(self.log)


async def _git_log(env: corral.ToolEnv, args: dict[str, Any]) -> Any:
    git = await env.module("git")
    return {"commits": await git.commits(), "allow_push": env.policy.allow_push}


def git_tools(policy: GitPolicy) -> list[ToolSpec]:
    schema = {"type": "object", "properties": {}, "additionalProperties": False}
    return [ToolSpec("workspace_git_log", "Show the git log.", schema, _git_log, "git_log")]


class GitPlugin:
    """A third-party plugin: a capability, a provider that populates it, a command."""

    @corral.hookimpl
    def corral_register_capabilities(self, register: Callable[[Capability], None]) -> None:
        register(Capability("git", GitPolicy, git_tools, summary="git history"))

    @corral.hookimpl
    def corral_register_providers(self, register: Callable[[corral.ProviderSpec], None]) -> None:
        register(corral.ProviderSpec("git-host", GitProvider, {"git"}, summary="test"))


class GitProvider:
    provider_id = "git-host"
    capabilities = frozenset({"git"})
    schema_version = 1

    async def open(self, config: Any, session: Any, declared: Any = None) -> corral.OpenedWorkspace:
        ws = corral.ModularWorkspace("g1", extra_modules={"git": FakeGit()})
        return corral.OpenedWorkspace(ws, corral.WorkspaceRef("git-host", {}, {"git"}, 1))

    async def resolve(self, ref: corral.WorkspaceRef) -> Any:
        raise corral.WorkspaceFailedError("not resumable")


async def test_third_party_capability_adds_a_tool_without_touching_core() -> None:
    plugins = corral.load_plugins([GitPlugin()], entrypoints=False)
    assert "git" in plugins.capabilities
    async with corral.open_workspace(
        "git-host", {"git": {"allow_push": True}}, plugins=plugins
    ) as ws:
        assert [t.name for t in ws.tools] == ["workspace_git_log"]
        result = await ws.call("workspace_git_log", {})
    assert result.data == {"commits": ["initial commit"], "allow_push": True}


async def test_default_capabilities_are_what_the_provider_supports() -> None:
    plugins = corral.load_plugins([GitPlugin()], entrypoints=False)
    async with corral.open_workspace("git-host", plugins=plugins) as ws:
        assert [t.name for t in ws.tools] == ["workspace_git_log"]


def test_builtin_capabilities_come_through_the_hook() -> None:
    plugins = corral.load_plugins(entrypoints=False)
    assert set(plugins.capabilities) == {"fs", "shell", "code", "script", "snapshot"}
    assert plugins.manager.get_plugin("corral.builtin") is not None


def test_misspelled_hookimpl_fails_loudly() -> None:
    class Typo:
        @corral.hookimpl
        def corral_register_provider(self, register: Any) -> None:  # missing "s"
            pass

    with pytest.raises(Exception, match="corral_register_provider"):
        corral.load_plugins([Typo()], entrypoints=False)


def test_duplicate_registration_is_an_error() -> None:
    with pytest.raises(corral.ConfigError, match="registered twice"):
        corral.load_plugins([GitPlugin(), GitPlugin()], entrypoints=False)


def test_entry_point_plugins_load_and_can_be_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    plugins = corral.load_plugins()
    assert "in-memory" in plugins.providers
    assert plugins.providers["in-memory"].version is not None
    monkeypatch.setenv(corral.BLOCK_ENV, "memory, other")
    blocked = corral.load_plugins()
    assert "in-memory" not in blocked.providers
    with pytest.raises(corral.ConfigError, match="unknown provider kind 'in-memory'"):
        blocked.provider("in-memory")


def test_a_broken_entry_point_is_recorded_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata as md

    real = md.entry_points

    def with_broken(**kw: Any) -> Any:
        eps = list(real(**kw))
        if kw.get("group") == "corral":
            eps.append(md.EntryPoint("broken", "corral_no_such_module._plugin", "corral"))
        return eps

    monkeypatch.setattr(md, "entry_points", with_broken)
    plugins = corral.load_plugins()
    assert "broken" in plugins.failed
    assert "ModuleNotFoundError" in plugins.failed["broken"]
    assert "in-memory" in plugins.providers
    with pytest.raises(corral.ConfigError, match="plugin 'broken' failed to load"):
        plugins.provider("nope")


def test_capability_tools_must_use_the_workspace_prefix() -> None:
    def bad_tools(policy: Any) -> list[ToolSpec]:
        return [ToolSpec("git_log", "x", {"type": "object"}, _git_log, "git_log")]

    class Bad:
        @corral.hookimpl
        def corral_register_capabilities(self, register: Any) -> None:
            register(Capability("bad", GitPolicy, bad_tools))

    plugins = corral.load_plugins([Bad()], entrypoints=False)
    config = corral.WorkspaceConfig(corral.ProviderConfig("git-host"), {"bad": True})
    registry = WorkspaceRegistry(config, SessionRef("s"), GitProvider())
    with pytest.raises(corral.ConfigError, match="must start with workspace_"):
        WorkspaceToolset(registry, plugins.capabilities)
