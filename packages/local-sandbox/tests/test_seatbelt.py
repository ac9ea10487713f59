"""The generated seatbelt profile (unit), and a real suite for macOS CI (CORRAL_TEST_SEATBELT=1)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import corral
import corral.provider
from corral_local_sandbox import (
    LocalSandboxProvider,
    NetworkPolicy,
    ProtectedPath,
    SandboxPolicy,
    SeatbeltWrapper,
    seatbelt_params,
    seatbelt_profile,
)
from corral_posix import WrapContext

POLICY = SandboxPolicy(
    protected_paths=(ProtectedPath(".git/hooks", True), ProtectedPath(".bashrc"))
)


def _balanced(text: str) -> bool:
    depth = 0
    for char in re.sub(r'"[^"]*"', "", text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def test_profile_is_deny_by_default_with_workspace_writes() -> None:
    profile = seatbelt_profile(POLICY)
    assert profile.startswith("(version 1)\n(deny default)\n")
    assert _balanced(profile)
    assert '(allow file-write* (subpath (param "WORKSPACE")) (subpath (param "TMPDIR")))' in profile
    assert '(deny file-read* (subpath (param "HOST_HOME")))' in profile
    assert "network" not in profile
    assert "system-socket" not in profile
    # Denials come after the allow they override (later rules win in SBPL).
    assert profile.index("(allow file-write*") < profile.index(
        '(deny file-write* (subpath (param "PROTECTED_0"))'
    )


def test_profile_never_contains_paths() -> None:
    profile = seatbelt_profile(POLICY)
    assert "/" not in re.sub(r'"(/dev/(null|zero))"', "", profile).replace("(version 1)", "")


def test_protected_paths_and_ancestors_are_parameters(tmp_path: Path) -> None:
    params = seatbelt_params(
        POLICY, workspace=str(tmp_path), tmpdir=str(tmp_path), host_home="/home/u"
    )
    ws = os.path.realpath(tmp_path)
    assert params["WORKSPACE"] == ws
    assert params["PROTECTED_0"] == f"{ws}/.git/hooks"
    assert params["PROTECTED_1"] == f"{ws}/.bashrc"
    assert params["ANCESTOR_0"] == ws
    assert params["ANCESTOR_1"] == f"{ws}/.git"
    profile = seatbelt_profile(POLICY)
    for key in params:
        assert f'(param "{key}")' in profile
    assert (
        '(deny file-write-unlink (literal (param "ANCESTOR_0")) (literal (param "ANCESTOR_1")))'
        in profile
    )


def test_canonical_private_paths(tmp_path: Path) -> None:
    link = tmp_path / "var"
    (tmp_path / "private-var").mkdir()
    link.symlink_to(tmp_path / "private-var")
    params = seatbelt_params(POLICY, workspace=str(link), tmpdir=str(link), host_home=str(link))
    assert params["WORKSPACE"] == str((tmp_path / "private-var").resolve())


def test_network_on() -> None:
    profile = seatbelt_profile(SandboxPolicy(network=NetworkPolicy("on")))
    assert "(allow network-outbound)" in profile
    assert "(allow system-socket)" in profile


def test_wrapper_argv(tmp_path: Path) -> None:
    wrapper = SeatbeltWrapper(POLICY, str(tmp_path / "t"), "/Users/me")
    launch = wrapper.wrap(
        ["ls", "-la"], WrapContext(str(tmp_path), str(tmp_path), {"PATH": "/usr/bin", "K": "v"})
    )
    argv = list(launch.argv)
    assert argv[:3] == ["/usr/bin/sandbox-exec", "-p", seatbelt_profile(POLICY)]
    assert f"WORKSPACE={os.path.realpath(tmp_path)}" in argv
    assert argv[-2:] == ["ls", "-la"]
    assert "ulimit -u 256" in argv[-4]
    assert launch.env["HOME"] == launch.env["TMPDIR"] == str(tmp_path / "t")


seatbelt = pytest.mark.skipif(
    sys.platform != "darwin" or os.environ.get("CORRAL_TEST_SEATBELT") != "1",
    reason="real seatbelt suite: macOS with CORRAL_TEST_SEATBELT=1",
)


@seatbelt
@pytest.mark.anyio
async def test_real_seatbelt_sandbox(tmp_path: Path) -> None:
    provider = LocalSandboxProvider(tmpdir_root=str(tmp_path))
    opened = await provider.open(corral.ProviderConfig("local-sandbox"), corral.SessionRef("s"))
    ws: Any = opened.workspace
    try:

        async def run(cmd: str) -> corral.ExecResult:
            return await ws.shell.run(corral.provider.CommandRequest(cmd, allow_shell_syntax=True))

        assert (await run("echo ok > f && cat f")).stdout == "ok\n"
        assert (
            await run(f"echo x > {os.path.expanduser('~')}/corral-seatbelt-test")
        ).exit_code != 0
        assert (await run("echo x > .bashrc")).exit_code != 0
        assert (await run("mkdir -p .git/hooks && echo x > .git/hooks/pre-commit")).exit_code != 0
        assert (await run("curl -sS -m 3 https://example.com")).exit_code != 0
        assert ws.details()["backend"] == "seatbelt"
    finally:
        await ws.close()
