"""Issue 17: the CLI's and the library's manners, each run as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def run(
    tmp_path: Path, *args: str, disable: str = "", module: str = "corral._cli"
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_STATE_DIR": str(tmp_path / "state")}
    env.pop("CORRAL_LOG_LEVEL", None)
    if disable:
        env["CORRAL_DISABLE_PLUGINS"] = disable
    else:
        env.pop("CORRAL_DISABLE_PLUGINS", None)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_version(tmp_path: Path) -> None:
    proc = run(tmp_path, "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "corral 0.1.0"


def test_python_dash_m_corral(tmp_path: Path) -> None:
    proc = run(tmp_path, "--version", module="corral")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("corral ")


def test_providers_has_a_header_and_says_whether_each_runs_here(tmp_path: Path) -> None:
    proc = run(tmp_path, "providers")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:4] == ["KIND", "VERSION", "CAPABILITIES", "RUNS"]
    memory = next(line for line in lines if line.startswith("in-memory "))
    assert "  yes  " in memory
    rows = json.loads(run(tmp_path, "providers", "--json").stdout)["providers"]
    by_kind = {r["kind"]: r for r in rows}
    assert by_kind["in-memory"]["available"] is True
    assert by_kind["in-memory"]["outlives_process"] is False
    assert by_kind["local-bash"]["outlives_process"] is True


def test_providers_reports_why_a_provider_cannot_run(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no bwrap on PATH
    script = textwrap.dedent(
        """
        import corral
        spec = corral.load_plugins().providers["local-sandbox"]
        print(spec.availability())
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "bubblewrap" in proc.stdout
    assert "install" in proc.stdout


def test_sessions_says_when_there_are_none(tmp_path: Path) -> None:
    proc = run(tmp_path, "sessions")
    assert proc.returncode == 0, proc.stderr
    assert "no stored sessions" in proc.stdout


def test_an_in_memory_session_is_not_stored_and_the_cli_says_why(tmp_path: Path) -> None:
    proc = run(
        tmp_path,
        "call",
        "--provider",
        "in-memory",
        "--session",
        "m",
        "workspace_write_file",
        '{"path": "/a", "content": "x"}',
    )
    assert proc.returncode == 0, proc.stderr
    assert "not stored" in proc.stderr
    assert "in-memory" in proc.stderr
    listed = json.loads(run(tmp_path, "sessions", "--json").stdout)
    assert listed == []


def test_tools_refuses_a_capability_the_provider_cannot_populate(tmp_path: Path) -> None:
    proc = run(tmp_path, "tools", "--provider", "in-memory", "--capabilities", '{"code": true}')
    assert proc.returncode == 2
    assert "workspace_run_code" not in proc.stdout
    assert "cannot populate capabilities: code" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("verb", "dist"), [("mcp", "corral-mcp"), ("conformance", "corral-conformance")]
)
def test_a_verb_of_a_missing_package_says_what_to_install(
    tmp_path: Path, verb: str, dist: str
) -> None:
    proc = run(tmp_path, verb, "--some-flag", "x", disable=verb)
    assert proc.returncode == 2
    assert f"pip install {dist}" in proc.stderr
    assert "invalid choice" not in proc.stderr


@pytest.mark.parametrize(
    ("kind", "advice"),
    [
        ("docker", "pip install corral-docker"),
        ("local-sandbox", "pip install corral-local-sandbox"),
        ("in-memory", "pip install corral-memory"),
    ],
)
def test_an_unknown_kind_suggests_its_own_distribution(
    tmp_path: Path, kind: str, advice: str
) -> None:
    entry = {"docker": "docker", "local-sandbox": "local-sandbox", "in-memory": "memory"}[kind]
    proc = run(tmp_path, "tools", "--provider", kind, disable=entry)
    assert proc.returncode == 2
    assert advice in proc.stderr
    assert "corral-local-bash" not in proc.stderr or kind == "local-bash"


def test_an_unknown_third_party_kind_gets_no_made_up_package(tmp_path: Path) -> None:
    proc = run(tmp_path, "tools", "--provider", "e2b")
    assert proc.returncode == 2
    assert "pip install" not in proc.stderr
    assert "install the distribution that provides it" in proc.stderr


def test_a_bad_local_bash_option_lists_the_valid_ones(tmp_path: Path) -> None:
    proc = run(tmp_path, "tools", "--provider", "local-bash", "--provider-options", '{"root": 1}')
    assert proc.returncode == 2
    assert "bad options: unknown option 'root'" in proc.stderr
    assert "tmpdir_root" in proc.stderr
    assert "LocalBashProvider" not in proc.stderr


def test_call_names_its_arguments_as_help_does(tmp_path: Path) -> None:
    helptext = run(tmp_path, "call", "--help").stdout
    assert "ARGS_JSON" in helptext
    bad = run(tmp_path, "call", "--provider", "in-memory", "--session", "x", "workspace_ls", "{")
    assert "ARGS_JSON is not valid JSON" in bad.stderr


def test_demo_into_a_closed_pipe_exits_without_a_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "CORRAL_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.run(
        f"{sys.executable} -m corral demo --provider in-memory | head -1",
        shell=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.stdout.startswith("provider: in-memory")
    assert "Traceback" not in proc.stderr
    assert "BrokenPipe" not in proc.stderr


def test_the_library_never_prints_unless_logging_is_configured(tmp_path: Path) -> None:
    # A lazy session whose provider cannot open logs a warning at the first call;
    # without logging configured, stderr stays empty.
    script = textwrap.dedent(
        """
        import anyio, corral, logging, sys
        from corral_local_sandbox import LocalSandboxProvider

        async def main():
            provider = LocalSandboxProvider(bwrap_path="/nonexistent/bwrap")
            async with corral.open_workspace(
                provider, {"fs": True, "shell": True}, open_strategy="lazy"
            ) as ws:
                result = await ws.call("workspace_ls", {"path": "/"})
                assert result.error_code == "workspace_failed", result
            logging.getLogger("corral.plugins").warning("a plugin warning")

        anyio.run(main)
        if sys.argv[1:] == ["configured"]:
            logging.basicConfig()
            logging.getLogger("corral.registry").warning("now it shows")
        """
    )
    quiet = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""
    loud = subprocess.run(
        [sys.executable, "-c", script, "configured"], capture_output=True, text=True, check=False
    )
    assert "now it shows" in loud.stderr
