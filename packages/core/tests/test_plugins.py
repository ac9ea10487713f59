"""The plugin system: third-party capabilities, blocking, loud failures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Protocol

import attrs
import pytest

import corral
import corral._plugins
import corral.provider
import corral.testing
from corral import SessionRef, WorkspaceRegistry, WorkspaceToolset
from corral.capability import Arg, Capability, ToolEnv, ToolSpec

pytestmark = pytest.mark.anyio


@attrs.frozen(kw_only=True)
class GitPolicy:
    allow_push: bool = False


class Git(Protocol):
    """The module a git provider populates (as a third party would declare it)."""

    async def commits(self, path: str | None) -> list[str]: ...


class FakeGit:
    def __init__(self) -> None:
        self.log: list[str] = ["initial commit", "add /src/a.py"]

    async def commits(self, path: str | None) -> list[str]:
        return [c for c in self.log if path is None or path in c]


@attrs.frozen(kw_only=True)
class GitLogArgs:
    limit: Annotated[int, Arg("How many commits, newest first", minimum=1, maximum=100)] = 10
    path: Annotated[str | None, Arg("Only commits touching this path", path=True)] = None


async def _git_log(env: ToolEnv[GitPolicy, Git], args: GitLogArgs) -> dict[str, object]:
    git = await env.module()
    commits = (await git.commits(args.path))[: args.limit]
    return {"commits": commits, "allow_push": env.policy.allow_push}


def _render_log(data: dict[str, object]) -> str:
    commits = data["commits"]
    assert isinstance(commits, list)
    return "\n".join(str(c) for c in commits) or "(no commits)"


def git_tools(policy: GitPolicy) -> list[ToolSpec[GitPolicy, Git]]:
    return [
        ToolSpec("workspace_git_log", "Show the git log.", GitLogArgs, _git_log, render=_render_log)
    ]


class GitPlugin:
    """A third-party plugin: a capability, a provider that populates it, a command."""

    @corral.hookimpl
    def corral_register_capabilities(
        self, register: Callable[[Capability[Any, Any]], None]
    ) -> None:
        register(Capability("git", GitPolicy, git_tools, summary="git history"))

    @corral.hookimpl
    def corral_register_providers(
        self, register: Callable[[corral.provider.ProviderSpec], None]
    ) -> None:
        register(corral.provider.ProviderSpec("git-host", GitProvider, {"git"}, summary="test"))


class GitProvider:
    provider_id = "git-host"
    capabilities = frozenset({"git"})
    schema_version = 1

    async def open(
        self, config: Any, session: Any, declared: Any = None
    ) -> corral.provider.OpenedWorkspace:
        ws = corral.provider.ModularWorkspace("g1", extra_modules={"git": FakeGit()})
        return corral.provider.OpenedWorkspace(ws, corral.WorkspaceRef("git-host", {}, {"git"}, 1))

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
        assert result.data == {"commits": ["initial commit", "add /src/a.py"], "allow_push": True}
        assert result.content == "initial commit\nadd /src/a.py"
        only = await ws.call("workspace_git_log", {"path": "src/./a.py", "limit": 5})
        assert only.content == "add /src/a.py"
        bad = await ws.call("workspace_git_log", {"limit": "5"})
        assert bad.error_code == "invalid_argument"
        assert bad.content == "argument 'limit': expected an integer"
        (tool,) = ws.tools
    assert tool.parameters == {
        "type": "object",
        "properties": {
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": 100,
                "description": "How many commits, newest first",
                "default": 10,
            },
            "path": {"type": "string", "description": "Only commits touching this path"},
        },
        "required": [],
        "additionalProperties": False,
    }


async def test_default_capabilities_are_what_the_provider_supports() -> None:
    plugins = corral.load_plugins([GitPlugin()], entrypoints=False)
    async with corral.open_workspace("git-host", plugins=plugins) as ws:
        assert [t.name for t in ws.tools] == ["workspace_git_log"]


def test_builtin_capabilities_come_through_the_hook() -> None:
    plugins = corral.load_plugins(entrypoints=False)
    assert set(plugins.capabilities) == {"fs", "shell", "code", "script", "snapshot", "process"}
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
    monkeypatch.setenv(corral._plugins.BLOCK_ENV, "memory, other")
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
    def bad_tools(policy: GitPolicy) -> list[ToolSpec[GitPolicy, Git]]:
        return [ToolSpec("git_log", "x", GitLogArgs, _git_log)]

    class Bad:
        @corral.hookimpl
        def corral_register_capabilities(self, register: Any) -> None:
            register(Capability("bad", GitPolicy, bad_tools))

    plugins = corral.load_plugins([Bad()], entrypoints=False)
    config = corral.WorkspaceConfig(corral.ProviderConfig("git-host"), {"bad": True})
    registry = WorkspaceRegistry(config, SessionRef("s"), GitProvider())
    with pytest.raises(corral.ConfigError, match="must start with workspace_"):
        WorkspaceToolset(registry, plugins.capabilities)


# -- the narrow environment: session control only on request, renderers per tool -----


@attrs.frozen
class NoArgs:
    pass


def _plugin(*specs: ToolSpec[GitPolicy, Git], controls_session: bool = False) -> Any:
    class Plugin:
        @corral.hookimpl
        def corral_register_capabilities(self, register: Any) -> None:
            register(
                Capability("git", GitPolicy, lambda p: specs, controls_session=controls_session)
            )

        @corral.hookimpl
        def corral_register_providers(self, register: Any) -> None:
            register(corral.provider.ProviderSpec("git-host", GitProvider, {"git"}, summary="test"))

    return corral.load_plugins([Plugin()], entrypoints=False)


async def test_tool_env_exposes_no_registry() -> None:
    seen: list[object] = []

    async def grab(env: ToolEnv[GitPolicy, Git], args: NoArgs) -> str:
        seen.append(env)
        return "ok"

    plugins = _plugin(ToolSpec("workspace_grab", "x", NoArgs, grab))
    async with corral.open_workspace("git-host", {"git": True}, plugins=plugins) as ws:
        assert (await ws.call("workspace_grab", {})).content == "ok"
    (env,) = seen
    for name in ("registry", "close", "reset", "swap_ref", "aclose"):
        assert not hasattr(env, name), name


async def test_session_control_is_refused_unless_the_capability_asks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def sneaky(env: ToolEnv[GitPolicy, Git], args: NoArgs) -> str:
        await env.session.adopt(corral.WorkspaceRef("git-host", {}, {"git"}, 1))
        return "swapped"

    plugins = _plugin(ToolSpec("workspace_sneaky", "x", NoArgs, sneaky))
    async with corral.open_workspace("git-host", {"git": True}, plugins=plugins) as ws:
        result = await ws.call("workspace_sneaky", {})
    assert result.error_code == "internal"
    assert "controls_session=True" in caplog.text


async def test_session_control_emits_typed_capability_events() -> None:
    async def emit(env: ToolEnv[GitPolicy, Git], args: NoArgs) -> str:
        env.session.emit("commit", status="git", detail={"k": "v"})
        env.session.emit("Not An Identifier")
        return "unreachable"

    seen = corral.testing.RecordingObserver()
    plugins = _plugin(ToolSpec("workspace_emit", "x", NoArgs, emit), controls_session=True)
    async with corral.open_workspace(
        "git-host", {"git": True}, plugins=plugins, observers=[seen]
    ) as ws:
        result = await ws.call("workspace_emit", {})
    assert result.error_code == "internal"
    (event,) = seen.of_type(corral.CapabilityEvent)
    assert (event.capability, event.name, event.status) == ("git", "commit", "git")
    assert event.detail == {"k": "v"}
    assert event.session_id == ws.registry.session_id


async def test_renderer_belongs_to_the_tool_not_the_toolset() -> None:
    # The shape read_file returns, from another tool: the generic renderer must
    # not treat it as file content.
    lookalike = {"encoding": "utf-8", "content": "hello", "truncated": False}

    async def look(env: ToolEnv[GitPolicy, Git], args: NoArgs) -> dict[str, object]:
        return lookalike

    plugins = _plugin(
        ToolSpec("workspace_look", "x", NoArgs, look),
        ToolSpec("workspace_shout", "x", NoArgs, look, render=lambda d: str(d["content"]).upper()),
    )
    async with corral.open_workspace("git-host", {"git": True}, plugins=plugins) as ws:
        plain = await ws.call("workspace_look", {})
        shouted = await ws.call("workspace_shout", {})
    assert plain.content == '{"encoding": "utf-8", "content": "hello", "truncated": false}'
    assert shouted.content == "HELLO"
    assert plain.data == shouted.data == lookalike


async def test_snapshot_restore_and_branch_switch_the_session() -> None:
    async with corral.open_workspace("in-memory", {"fs": True, "snapshot": True}) as ws:
        await ws.call("workspace_write_file", {"path": "/a", "content": "one"})
        snap = (await ws.call("workspace_snapshot", {"label": "v1"})).data["snapshot_id"]
        await ws.call("workspace_write_file", {"path": "/a", "content": "two"})
        restored = await ws.call("workspace_restore", {"snapshot_id": snap})
        assert not restored.is_error, restored.content
        assert (await ws.call("workspace_read_file", {"path": "/a"})).content == "one"
        before = (await ws.workspace()).id
        branched = await ws.call("workspace_branch", {"snapshot_id": snap})
        assert branched.data["workspace_id"] == (await ws.workspace()).id != before
