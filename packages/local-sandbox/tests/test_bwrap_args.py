"""The bubblewrap command line, protected-path mounts and the sandbox environment."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import corral
from corral_local_sandbox import (
    BwrapFeatures,
    BwrapWrapper,
    NetworkPolicy,
    ProtectedPath,
    SandboxLimits,
    SandboxPolicy,
    build_bwrap_args,
)
from corral_local_sandbox._bwrap import EXEC_SHIM, LAUNCHER, sandbox_env
from corral_posix import WrapContext

FEATURES = BwrapFeatures(disable_userns=True, tmpfs_size=True)


def _args(root: Path, **kw: object) -> list[str]:
    policy = kw.pop("policy", SandboxPolicy(protected_paths=()))
    return build_bwrap_args(
        host_root=str(root),
        host_cwd=str(kw.pop("cwd", root)),
        policy=policy,  # type: ignore[arg-type]
        features=kw.pop("features", FEATURES),  # type: ignore[arg-type]
        seccomp=bool(kw.pop("seccomp", True)),
    )


def _pairs(args: list[str], flag: str) -> list[tuple[str, str]]:
    return [(args[i + 1], args[i + 2]) for i, a in enumerate(args) if a == flag]


def test_hardening_flags(tmp_path: Path) -> None:
    args = _args(tmp_path)
    for flag in ("--new-session", "--die-with-parent", "--unshare-all", "--disable-userns"):
        assert flag in args
    assert args[args.index("--cap-drop") + 1] == "ALL"
    assert args[args.index("--seccomp") + 1] == "9"
    assert "--share-net" not in args
    assert tuple(a for a in args if a in ("/proc", "/dev")) >= ("/proc", "/dev")
    assert (str(tmp_path), "/workspace") in _pairs(args, "--bind")
    assert args[args.index("--chdir") - 2 : args.index("--chdir")] == ["--remount-ro", "/"]
    assert args[args.index("--chdir") + 1] == "/workspace"
    tmpfs = [args[i + 1] for i, a in enumerate(args) if a == "--tmpfs"]
    assert {"/tmp", "/home/sandbox", "/dev/shm"} <= set(tmpfs)
    assert all(
        args[i - 2] == "--size"
        for i, a in enumerate(args)
        if a == "--tmpfs" and args[i + 1] in ("/tmp", "/home/sandbox")
    )


def test_system_is_read_only_and_secrets_masked(tmp_path: Path) -> None:
    args = _args(tmp_path)
    ro = _pairs(args, "--ro-bind")
    assert ("/usr", "/usr") in ro or "/usr" in list(args)
    assert ("/etc", "/etc") in ro
    if os.path.exists("/etc/shadow"):
        assert ("/dev/null", "/etc/shadow") in ro
    host_home = os.path.expanduser("~")
    assert all(
        not src.startswith(host_home + "/") and src != host_home
        for src, _ in ro + _pairs(args, "--bind")
        if src != str(tmp_path)
    )


def test_network_on_and_old_bwrap(tmp_path: Path) -> None:
    args = _args(
        tmp_path,
        policy=SandboxPolicy(network=NetworkPolicy("on"), protected_paths=()),
        features=BwrapFeatures(),
        seccomp=False,
    )
    assert "--share-net" in args
    assert "--disable-userns" not in args
    assert "--size" not in args
    assert "--seccomp" not in args


def test_cwd_maps_into_the_sandbox_and_must_stay_inside(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    args = _args(tmp_path, cwd=tmp_path / "a" / "b")
    assert args[args.index("--chdir") + 1] == "/workspace/a/b"
    with pytest.raises(corral.OperationError) as info:
        _args(tmp_path / "a", cwd=tmp_path)
    assert info.value.code == "invalid_path"


def test_nothing_inside_the_workspace_is_bound(tmp_path: Path) -> None:
    # Existing protected paths used to be bound read-only, their parents pinned;
    # bwrap resolved those host paths long after the check, and a swapped
    # symlink bound a host directory into the sandbox (issue 11). They are now
    # verified around each command instead, and never bound.
    (tmp_path / ".git" / "hooks").mkdir(parents=True)
    (tmp_path / ".git" / "config").write_text("[core]\n")
    (tmp_path / ".bashrc").write_text("")
    args = _args(tmp_path, policy=SandboxPolicy())
    assert [a for a in args if a.startswith(str(tmp_path))] == [str(tmp_path)]


def test_no_protected_mounts_by_default(tmp_path: Path) -> None:
    args = _args(tmp_path, policy=SandboxPolicy())
    assert [a for a in args if a.startswith(str(tmp_path))] == [str(tmp_path)]


@pytest.mark.parametrize("bad", ["", "/abs", "a/../b", "./x", "a//b"])
def test_protected_path_validation(bad: str) -> None:
    with pytest.raises(ValueError, match="relative path"):
        ProtectedPath(bad)


def test_wrapper_keeps_secrets_off_the_command_line(tmp_path: Path) -> None:
    wrapper = BwrapWrapper(
        bwrap="/usr/bin/bwrap",
        policy=SandboxPolicy(protected_paths=()),
        features=FEATURES,
        seccomp_file="/x/filter.bpf",
        prlimit="/usr/bin/prlimit",
    )
    env = {"PATH": "/root/.venv/bin:/usr/bin:/bin", "API_TOKEN": "s3cr3t-value", "PWD": "/host"}
    launch = wrapper.wrap(["sh", "-c", "echo hi"], WrapContext(str(tmp_path), str(tmp_path), env))
    assert not any("s3cr3t" in a for a in launch.argv)
    assert "--setenv" not in launch.argv
    assert "--clearenv" not in launch.argv
    assert launch.argv[0] == "/bin/sh"
    assert launch.argv[6] == "/usr/bin/bwrap"
    assert launch.argv[-3:] == ("sh", "-c", "echo hi")
    assert launch.argv[-7:-3] == ("--", "/usr/bin/prlimit", "--nproc=256:256", "--")
    assert not any(a.startswith("--as=") for a in launch.argv)  # set by the supervisor
    assert launch.env["HOME"] == "/home/sandbox"
    assert launch.env["TMPDIR"] == "/tmp"
    assert launch.env["PATH"] == "/usr/bin:/bin"
    assert "PWD" not in launch.env
    assert launch.pass_fds == ()


def test_sandbox_env_defaults_path() -> None:
    assert sandbox_env({})["PATH"].startswith("/usr/local/bin")


def test_direct_launch_without_seccomp_or_cgroup(tmp_path: Path) -> None:
    wrapper = BwrapWrapper(
        bwrap="/usr/bin/bwrap",
        policy=SandboxPolicy(limits=SandboxLimits(processes=None)),
        features=FEATURES,
        prlimit="/usr/bin/prlimit",
    )
    launch = wrapper.wrap(["true"], WrapContext(str(tmp_path), str(tmp_path), {}))
    assert launch.argv[0] == "/usr/bin/bwrap"  # no shell launcher, no prlimit exec
    assert launch.argv[-2:] == ("--", "true")
    assert "--seccomp" not in launch.argv


def test_launcher_joins_every_cgroup_before_bwrap(tmp_path: Path) -> None:
    procs = [tmp_path / "pids.procs", tmp_path / "memory.procs"]
    for p in procs:
        p.write_text("")
    argv = ["/bin/sh", "-c", LAUNCHER, "corral-sandbox", "", "2", *map(str, procs)]
    done = subprocess.run(
        [*argv, "/bin/sh", "-c", "echo $$"], capture_output=True, text=True, check=False
    )
    pid = done.stdout.strip()
    assert pid
    assert all(p.read_text().strip() == pid for p in procs)
    missing = subprocess.run([*argv[:-1], str(tmp_path / "no" / "such"), "true"], check=False)
    assert missing.returncode == 125  # a cgroup it cannot join: nothing runs


def test_exec_shim_only_where_bwrap_could_not_report_127_or_126(tmp_path: Path) -> None:
    wrapper = BwrapWrapper(
        bwrap="/usr/bin/bwrap",
        policy=SandboxPolicy(limits=SandboxLimits(processes=None)),
        features=FEATURES,
        cgroup_procs=("/sys/fs/cgroup/pids/x/cgroup.procs",),
    )
    ctx = WrapContext(str(tmp_path), str(tmp_path), {"PATH": "/usr/bin:/bin"})

    def inner(argv: list[str]) -> tuple[str, ...]:
        launch = wrapper.wrap(argv, ctx).argv
        return launch[launch.index("--") + 1 :]

    assert inner(["sh", "-c", "x"]) == ("sh", "-c", "x")
    assert inner(["python3", "-V"]) == ("python3", "-V")
    for argv in (["no-such-program-xyz"], ["./script"], ["/workspace/x"]):
        assert inner(argv) == (*EXEC_SHIM, *argv)
