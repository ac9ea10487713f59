"""The pytest plugin, the CLI command and the report, run as a user would run them.

pytest runs in a subprocess (a real, separate pytest) from a scratch
directory with its own empty ini, so the repository's configuration does not
leak in. ``pytest_plugins = ["pytester"]`` is not usable here: pytest refuses
it outside the rootdir's conftest.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from corral_conformance import ConformanceReport, RuleResult, check_kind
from corral_conformance._rules import RULES, define

pytest.importorskip("corral_memory", reason="the plugin tests run against corral-memory")


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    # The dev venv holds pytest-asyncio (through langchain-tests), which warns at
    # start-up unless configured; a user's unrelated plugin is not under test here.
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:asyncio", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_plugin_runs_the_suite_against_an_installed_provider(tmp_path: Path) -> None:
    run = _pytest(tmp_path, "--corral-provider=in-memory", "--corral-max-examples=5", "-v")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    for rule in (
        "test_fs_matches_reference_model",
        "test_junk_payload_rejected",
        "test_spec_matches_provider",
    ):
        assert re.search(rf"{rule}(\[asyncio\])? PASSED", run.stdout), run.stdout[-3000:]
    assert re.search(r"test_shell_env\[asyncio\] SKIPPED", run.stdout), run.stdout[-3000:]


def test_plugin_by_module_name_without_autoload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pytest11 entry point already loads the plugin; naming it again with
    # -p only works (and is only needed) when autoloading is off.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    run = _pytest(
        tmp_path,
        "-p",
        "corral_conformance.pytest_plugin",
        "-p",
        "anyio",
        "--corral-provider=in-memory",
        "--corral-max-examples=3",
        "-k",
        "ref_stamps or close_is",
        "-v",
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "test_ref_stamps_current_schema_version[asyncio] PASSED" in run.stdout


def test_plugin_is_inert_without_the_option(tmp_path: Path) -> None:
    (tmp_path / "test_mine.py").write_text("def test_one():\n    assert True\n", encoding="utf-8")
    run = _pytest(tmp_path, "-W", "error", "--collect-only", "-q")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "test_mine.py::test_one" in run.stdout
    assert "1 test collected" in run.stdout, run.stdout
    assert "conformance" not in run.stdout.lower()
    fixtures = _pytest(tmp_path, "--fixtures", "-q")
    for name in ("conformance", "provider_options", "workspace_host_dir"):
        assert name not in fixtures.stdout, f"fixture {name!r} leaks into every run"
    assert "warning" not in (run.stdout + run.stderr).lower()


def test_plugin_adds_the_suite_to_explicit_paths(tmp_path: Path) -> None:
    (tmp_path / "test_mine.py").write_text("def test_one():\n    assert True\n", encoding="utf-8")
    run = _pytest(tmp_path, "test_mine.py", "--corral-provider=in-memory", "--collect-only", "-q")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "test_mine.py::test_one" in run.stdout
    assert "test_fs_matches_reference_model" in run.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--corral-provider=no-such-kind"], "unknown provider kind"),
        (["--corral-provider=in-memory", "--corral-provider-options={bad"], "not valid JSON"),
        (["--corral-provider=in-memory", "--corral-provider-options=[1]"], "must be a JSON object"),
        (["--corral-provider=in-memory", '--corral-provider-options={"nope": 1}'], "bad options"),
    ],
)
def test_plugin_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    run = _pytest(tmp_path, *args)
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert message in run.stderr


def test_cli_prints_a_table_and_exits_zero(tmp_path: Path) -> None:
    run = subprocess.run(
        ["corral", "conformance", "in-memory", "--max-examples", "3"],
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split() == ["rule", "group", "status", "reason"]
    assert any(line.split()[:3] == ["fs_matches_reference_model", "fs", "pass"] for line in lines)
    assert any(
        line.split()[:3] == ["shell_exit_codes", "shell", "skip"] and "advertise shell" in line
        for line in lines
    )
    assert "0 failed" in lines[-1]


def test_cli_exits_non_zero_on_failures(tmp_path: Path) -> None:
    # A 4-byte file limit is a real misconfiguration: writes fail with too_large.
    run = subprocess.run(
        [
            "corral",
            "conformance",
            "in-memory",
            "--max-examples",
            "3",
            "--rule",
            "fs_basic_semantics",
            "--provider-options",
            '{"max_file_bytes": 4}',
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert any(
        line.split()[:3] == ["fs_basic_semantics", "fs", "fail"] for line in run.stdout.splitlines()
    )


def test_cli_usage_errors(tmp_path: Path) -> None:
    for extra, message in (
        (["no-such-kind"], "unknown provider kind"),
        (["in-memory", "--provider-options", "{"], "not valid JSON"),
    ):
        run = subprocess.run(
            ["corral", "conformance", *extra],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert run.returncode == 2, run.stdout + run.stderr
        assert message in run.stderr


def test_check_kind_reports_per_rule() -> None:
    report = check_kind("in-memory", rules=["spec_matches_provider", "shell_env"], max_examples=3)
    assert report.ok
    assert report.result("spec_matches_provider").status == "pass"
    assert report.result("shell_env").status == "skip"
    with pytest.raises(KeyError):
        report.result("fs_basic_semantics")


def test_report_table_and_verdict() -> None:
    report = ConformanceReport(
        "demo",
        (
            RuleResult("a_rule", "fs", "pass"),
            RuleResult("b_rule", "shell", "fail", "AssertionError: " + "x" * 300),
            RuleResult("c_rule", "snapshot", "skip", "not advertised"),
        ),
        1,
    )
    assert not report.ok
    assert [r.rule for r in report.failed] == ["b_rule"]
    table = report.format_table(width=80)
    assert all(len(line) <= 80 for line in table.splitlines())
    assert "b_rule" in table
    assert "…" not in table
    assert table.count("x") >= 300, "the failure reason was cut off"
    assert table.splitlines()[-1] == "demo: 1 passed, 1 failed, 1 skipped"


def test_report_names_the_broken_sentence_and_keeps_reasons_whole() -> None:
    rid = define("refs.demo_report", "demo source", "A demo sentence the provider broke.")
    try:
        _check_demo_report(rid)
    finally:
        RULES.pop(rid)  # keep the shared registry to the suite's own rules


def _check_demo_report(rid: str) -> None:
    reason = "AssertionError: first line\n" + "y" * 500
    report = ConformanceReport(
        "demo",
        (
            RuleResult("a_rule", "refs", "fail", reason, (rid,), 1.25),
            RuleResult("b_rule", "refs", "pass", "", (rid,), 0.5),
        ),
        1,
    )
    table = report.format_table(width=70)
    assert "A demo sentence the provider broke." in " ".join(table.split())
    assert "refs.demo_report" in table
    data = report.to_json()
    json.dumps(data)  # plain JSON
    assert data["provider"] == "demo"
    assert data["ok"] is False
    assert data["tests"][0]["reason"] == reason
    assert data["tests"][0]["rules"] == [rid]
    assert data["tests"][0]["duration_s"] == 1.25
    assert data["rules"][rid]["status"] == "fail"
    assert data["rules"][rid]["sentence"] == "A demo sentence the provider broke."
    assert data["rules"][rid]["tests"] == ["a_rule", "b_rule"]
    assert data["rules"][rid]["reasons"] == [reason]


def test_cli_json_report(tmp_path: Path) -> None:
    run = subprocess.run(
        ["corral", "conformance", "in-memory", "--max-examples", "3", "--json", "--rule", "refs"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads(run.stdout)
    assert data["provider"] == "in-memory"
    assert data["ok"] is True
    assert data["tests"], "no test ran"
    assert all(t["group"] == "ref" for t in data["tests"]), "--rule refs selected other areas"
    assert "refs.version.reject" in data["rules"]
    version = data["rules"]["refs.version.reject"]
    assert version["status"] == "pass"
    assert "schema_version" in version["sentence"]
    assert all(isinstance(t["duration_s"], float) for t in data["tests"])


def test_cli_json_keeps_failure_reasons_whole(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            "corral",
            "conformance",
            "in-memory",
            "--max-examples",
            "3",
            "--json",
            "--rule",
            "fs_basic_semantics",
            "--provider-options",
            '{"max_file_bytes": 4}',
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    data = json.loads(run.stdout)
    failed = [t for t in data["tests"] if t["status"] == "fail"]
    assert [t["test"] for t in failed] == ["fs_basic_semantics"]
    assert failed[0]["rules"], "the failure names no contract rule"
    assert all(data["rules"][rid]["sentence"] for rid in failed[0]["rules"])
    assert not failed[0]["reason"].endswith("…")
