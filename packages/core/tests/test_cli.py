"""The corral CLI, run as a real subprocess: one process per call, like a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def corral(state: Path, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_STATE_DIR": str(state)}
    env.pop("CORRAL_DISABLE_PLUGINS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "corral._cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


def test_providers_lists_installed_providers(tmp_path: Path) -> None:
    out = corral(tmp_path, "providers", "--json", check=True)
    kinds = {p["kind"]: p for p in as_json(out)["providers"]}
    assert kinds["in-memory"]["capabilities"] == ["fs", "snapshot"]
    assert kinds["in-memory"]["version"] == "0.1.0"
    assert "local-bash" in kinds


def test_call_resumes_the_workspace_in_a_new_process(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    opts = json.dumps({"tmpdir_root": str(root)})
    write = corral(
        tmp_path,
        "call",
        "--provider",
        "local-bash",
        "--provider-options",
        opts,
        "--session",
        "s1",
        "--json",
        "workspace_write_file",
        '{"path": "/notes/a.txt", "content": "hello"}',
    )
    assert write.returncode == 0, write.stderr
    assert as_json(write)["is_error"] is False
    # A second process: provider, options and capabilities come from the store.
    read = corral(
        tmp_path,
        "call",
        "--session",
        "s1",
        "--json",
        "workspace_read_file",
        '{"path": "notes/a.txt"}',
    )
    assert read.returncode == 0, read.stderr
    assert as_json(read)["content"] == "hello"
    run = corral(
        tmp_path, "call", "--session", "s1", "workspace_run", '{"command": "cat notes/a.txt"}'
    )
    assert json.loads(run.stdout)["stdout"] == "hello"
    sessions = as_json(corral(tmp_path, "sessions", "--json", check=True))
    assert [s["session_id"] for s in sessions] == ["s1"]
    closed = corral(tmp_path, "close", "--session", "s1", check=True)
    assert "closed" in closed.stdout
    assert as_json(corral(tmp_path, "sessions", "--json", check=True)) == []
    assert list(root.rglob("a.txt")) == []


def test_in_memory_workspace_is_not_stored_as_resumable(tmp_path: Path) -> None:
    first = corral(
        tmp_path,
        "call",
        "--provider",
        "in-memory",
        "--session",
        "m",
        "workspace_write_file",
        '{"path": "/a", "content": "x"}',
    )
    assert first.returncode == 0, first.stderr
    assert "is not stored" in first.stderr
    assert as_json(corral(tmp_path, "sessions", "--json", check=True)) == []


def test_tool_errors_are_one_line_and_nonzero(tmp_path: Path) -> None:
    proc = corral(
        tmp_path,
        "call",
        "--provider",
        "in-memory",
        "--session",
        "e",
        "workspace_read_file",
        '{"path": "/../x"}',
    )
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("corral: note:")]
    assert len(lines) == 1
    assert "escapes the workspace root" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["call", "--session", "x", "workspace_ls", "{not json"], "ARGS_JSON is not valid JSON"),
        (
            ["call", "--provider", "nope", "--session", "x", "workspace_ls"],
            "unknown provider kind 'nope'",
        ),
        (
            [
                "call",
                "--provider",
                "in-memory",
                "--session",
                "x",
                "--capabilities",
                '{"fs": {"size": 1}}',
                "workspace_ls",
            ],
            "capabilities.fs: unknown option 'size'",
        ),
        (
            ["tools", "--provider", "in-memory", "--capabilities", "[1]"],
            "--capabilities must be a JSON object",
        ),
    ],
)
def test_usage_and_config_errors_exit_2_without_traceback(
    tmp_path: Path, args: list[str], message: str
) -> None:
    proc = corral(tmp_path, *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_tools_exports_openai_and_anthropic_specs(tmp_path: Path) -> None:
    openai = as_json(
        corral(tmp_path, "tools", "--provider", "in-memory", "--format", "openai", check=True)
    )
    anthropic = as_json(
        corral(tmp_path, "tools", "--provider", "in-memory", "--format", "anthropic", check=True)
    )
    names = [t["function"]["name"] for t in openai]
    assert names == [t["name"] for t in anthropic]
    assert "workspace_snapshot" in names
    assert "workspace_run" not in names


def test_demo_runs_to_completion(tmp_path: Path) -> None:
    proc = corral(tmp_path, "demo", "--provider", "in-memory")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("agent finished: completed")
    assert "corral keeps files safe for you" in proc.stdout
    assert "(the poem was overwritten)" in proc.stdout
