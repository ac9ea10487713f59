"""The README's code runs: the quick example and both agent loops (against stub models)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

README = Path(__file__).parents[3] / "README.md"
pytestmark = pytest.mark.anyio


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def loop_block(marker: str) -> dict[str, Any]:
    code = next(b for b in blocks() if b.startswith(marker))
    namespace: dict[str, Any] = {}
    exec(compile(code, str(README), "exec"), namespace)
    return namespace


class Dumpable(SimpleNamespace):
    def model_dump(self, exclude_none: bool = False) -> dict[str, Any]:
        def plain(v: Any) -> Any:
            if isinstance(v, Dumpable):
                return v.model_dump(exclude_none)
            if isinstance(v, list):
                return [plain(x) for x in v]
            return v

        return {k: plain(v) for k, v in vars(self).items() if not (exclude_none and v is None)}


class StubOpenAI:
    """Writes a script, runs it, then answers with what the tool printed."""

    def __init__(self) -> None:
        self.turn = 0
        self.seen_tools: list[str] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def _call(self, name: str, args: dict[str, Any]) -> Dumpable:
        return Dumpable(
            id=f"call-{self.turn}",
            type="function",
            function=Dumpable(name=name, arguments=json.dumps(args)),
        )

    async def create(self, *, model: str, messages: list[Any], tools: list[Any]) -> Any:
        self.seen_tools = [t["function"]["name"] for t in tools]
        self.turn += 1
        if self.turn == 1:
            calls = [
                self._call("workspace_write_file", {"path": "/hi.py", "content": "print(6*7)"})
            ]
            message = Dumpable(role="assistant", content=None, tool_calls=calls)
        elif self.turn == 2:
            message = Dumpable(
                role="assistant",
                content=None,
                tool_calls=[self._call("workspace_run", {"command": "python3 hi.py"})],
            )
        else:
            last = json.loads(messages[-1]["content"])
            message = Dumpable(
                role="assistant", content=f"it printed {last['stdout'].strip()}", tool_calls=None
            )
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])


class StubAnthropic:
    def __init__(self) -> None:
        self.turn = 0
        self.messages = SimpleNamespace(create=self.create)

    async def create(
        self, *, model: str, max_tokens: int, messages: list[Any], tools: list[Any]
    ) -> Any:
        self.turn += 1
        if self.turn == 1:
            block = Dumpable(
                type="tool_use", id="tu-1", name="workspace_run", input={"command": "echo hello"}
            )
            return SimpleNamespace(content=[block], stop_reason="tool_use")
        result = messages[-1]["content"][0]
        assert result["type"] == "tool_result"
        assert result["is_error"] is False
        text = Dumpable(type="text", text=f"got {json.loads(result['content'])['stdout'].strip()}")
        return SimpleNamespace(content=[text], stop_reason="end_turn")


class StubResponses:
    """The Responses API: run a command, then answer with its output."""

    def __init__(self) -> None:
        self.turn = 0
        self.responses = SimpleNamespace(create=self.create)

    async def create(
        self, *, model: str, input: Any, tools: list[Any], previous_response_id: str | None = None
    ) -> Any:
        assert all(t["type"] == "function" and t["strict"] is True for t in tools)
        run = next(t for t in tools if t["name"] == "workspace_run")
        assert run["parameters"]["properties"]["env"]["anyOf"][0]["type"] == "array"
        self.turn += 1
        if self.turn == 1:
            call = Dumpable(
                type="function_call",
                call_id="fc-1",
                name="workspace_run",
                # What a strict-mode model sends: every argument, null for defaults.
                arguments=json.dumps(
                    {
                        "command": "printenv GREETING",
                        "cwd": None,
                        "timeout_s": None,
                        "env": [{"name": "GREETING", "value": "hello"}],
                        "stdin": None,
                    }
                ),
            )
            return SimpleNamespace(id="r1", output=[call], output_text="")
        assert previous_response_id == "r1"
        (item,) = input
        assert item["type"] == "function_call_output"
        assert item["call_id"] == "fc-1"
        stdout = json.loads(item["output"])["stdout"].strip()
        return SimpleNamespace(id="r2", output=[], output_text=f"it said {stdout}")


async def test_responses_loop_from_the_readme() -> None:
    agent = loop_block("# OpenAI Responses")["responses_agent"]
    assert await agent(StubResponses(), "stub", "greet") == "it said hello"


async def test_openai_loop_from_the_readme() -> None:
    agent = loop_block("# OpenAI Chat Completions")["openai_agent"]
    client = StubOpenAI()
    assert await agent(client, "stub", "compute") == "it printed 42"
    assert "workspace_run" in client.seen_tools


async def test_anthropic_loop_from_the_readme() -> None:
    agent = loop_block("# Anthropic Messages")["anthropic_agent"]
    assert await agent(StubAnthropic(), "stub", "greet") == "got hello"


def test_quick_example_from_the_readme(capsys: pytest.CaptureFixture[str]) -> None:
    code = next(b for b in blocks() if "anyio.run(main)" in b)
    exec(compile(code, str(README), "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["hi", "10"]


def _require(env: str, ready: bool, why: str) -> None:
    if ready:
        return
    if os.environ.get(env) == "1":
        pytest.fail(f"{why}, and {env}=1 requires it")
    pytest.skip(why)


def _docker_default_image_ready() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(
        ["docker", "image", "inspect", "debian:bookworm-slim"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return probe.returncode == 0


@pytest.mark.parametrize("kind", ["local-sandbox", "docker"])
def test_quick_example_runs_as_pasted_on_every_shell_provider(
    kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's first screen with only the provider kind changed, defaults and all."""
    if kind == "local-sandbox":
        _require("CORRAL_REQUIRE_BWRAP", shutil.which("bwrap") is not None, "no bubblewrap")
    else:
        _require(
            "CORRAL_REQUIRE_DOCKER",
            _docker_default_image_ready(),
            "no Docker engine with debian:bookworm-slim (packages/docker/scripts/ci-setup.sh)",
        )
    code = next(b for b in blocks() if "anyio.run(main)" in b)
    assert '"local-bash"' in code
    exec(compile(code.replace('"local-bash"', f'"{kind}"'), str(README), "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["hi", "10"]


def test_quick_example_on_in_memory_fails_at_open_as_the_readme_says() -> None:
    code = next(b for b in blocks() if "anyio.run(main)" in b)
    from corral import ConfigError

    with pytest.raises(ConfigError, match="shell"):
        exec(compile(code.replace('"local-bash"', '"in-memory"'), str(README), "exec"), {})


CORE_README = Path(__file__).parents[1] / "README.md"


def capability_example() -> Any:
    """The capability-author example of packages/core/README.md, as a real module
    (argument classes resolve their annotations through their module)."""
    code = next(
        b
        for b in re.findall(r"```python\n(.*?)```", CORE_README.read_text(), flags=re.DOTALL)
        if b.startswith("# A third-party capability")
    )
    module = types.ModuleType("corral_readme_capability")
    sys.modules[module.__name__] = module
    exec(compile(code, str(CORE_README), "exec"), module.__dict__)
    return module


async def test_capability_example_from_the_core_readme() -> None:
    import corral
    import corral.provider

    example = capability_example()
    await example.test_git_log()

    class GitProvider:
        provider_id = "git-host"
        capabilities = frozenset({"git"})
        schema_version = 1

        async def open(self, config: Any, session: Any, declared: Any = None) -> Any:
            ws = corral.provider.ModularWorkspace("g1", extra_modules={"git": example.FakeGit()})
            return corral.provider.OpenedWorkspace(
                ws, corral.WorkspaceRef("git-host", {}, {"git"}, 1)
            )

        async def resolve(self, ref: corral.WorkspaceRef) -> Any:
            raise corral.WorkspaceFailedError("not resumable")

    plugins = corral.load_plugins([example.GitPlugin()], entrypoints=False)
    async with corral.open_workspace(
        GitProvider(), {"git": {"max_commits": 5}}, plugins=plugins
    ) as ws:
        result = await ws.call("workspace_git_log", {"limit": 1, "path": "docs/../README"})
        bad = await ws.call("workspace_git_log", {"limit": 0})
        (tool,) = ws.tools
    assert result.content == "add README"
    assert result.data == ["add README"]
    assert bad.content == "argument 'limit': must be at least 1"
    assert tool.parameters["properties"]["limit"]["description"] == "How many commits, newest first"
