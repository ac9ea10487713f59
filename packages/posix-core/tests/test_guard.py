"""CommandChecker: allowlist, shell syntax, environment denylist, cwd, audit log."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.provider import CommandRequest, OperationError
from corral_posix import CommandChecker
from corral_posix._audit import AuditLog
from corral_posix._env import denied_reason, sanitize_path


def req(command: str, **kw: object) -> CommandRequest:
    return CommandRequest(command, **kw)  # type: ignore[arg-type]


def denied(guard: CommandChecker, request: CommandRequest) -> str:
    with pytest.raises(OperationError) as info:
        guard.check_request(request)
    assert info.value.code == "policy_denied", info.value.message
    return info.value.message


@pytest.mark.parametrize(
    ("command", "char", "what"),
    [
        ("ls | wc", "|", "pipe"),
        ("ls && rm x", "&", "background or '&&' list"),
        ("ls; rm x", ";", "command separator"),
        ("cat < x", "<", "redirection"),
        ("echo x > y", ">", "redirection"),
        ("(ls)", "(", "subshell"),
        ("echo $HOME", "$", "variable expansion"),
        ('echo "$HOME"', "$", "variable expansion"),
        ("echo `id`", "`", "command substitution"),
        ("echo $(id)", "$(", "command substitution"),
        ("ls\nrm x", "\n", "newline"),
        ("ls #x", "#", "comment"),
        ("ls ~", "~", "home directory expansion"),
    ],
)
def test_metacharacters_rejected_without_shell_syntax(command: str, char: str, what: str) -> None:
    message = denied(CommandChecker(), req(command))
    assert message == (
        f"command uses shell syntax ({char!r}, {what}), which is not allowed; "
        "run a single program with arguments"
    )


@pytest.mark.parametrize(("command", "char"), [("ls *.py", "*"), ("ls a?", "?"), ("ls [ab]", "[")])
def test_globs_rejected_without_shell_syntax(command: str, char: str) -> None:
    message = denied(CommandChecker(), req(command))
    assert message == (
        f"command uses a glob ({char!r}), which is not allowed without shell syntax; "
        "name the files explicitly"
    )


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ("grep 'a|b' file", ["grep", "a|b", "file"]),
        ("echo '*' \"x;y\" a\\ b", ["echo", "*", "x;y", "a b"]),
        ("git log --format=%h#x", ["git", "log", "--format=%h#x"]),
        ("echo a~b {x,y}", ["echo", "a~b", "{x,y}"]),
    ],
)
def test_quoted_metacharacters_are_plain_arguments(command: str, argv: list[str]) -> None:
    assert CommandChecker().check_command(req(command)) == argv


def test_shell_syntax_mode_runs_sh_c() -> None:
    guard = CommandChecker()
    assert guard.check_command(req("ls | wc -l", allow_shell_syntax=True)) == [
        "sh",
        "-c",
        "ls | wc -l",
    ]
    # A leading dash would be an option of sh.
    assert guard.check_command(req("-x", allow_shell_syntax=True)) == ["sh", "-c", " -x"]


@pytest.mark.parametrize(
    ("command", "code"),
    [
        ("", "invalid_argument"),
        ("   ", "invalid_argument"),
        ("ls\x00", "invalid_argument"),
        ("echo 'x", "invalid_argument"),
    ],
)
def test_malformed_commands(command: str, code: str) -> None:
    with pytest.raises(OperationError) as info:
        CommandChecker().check_request(req(command))
    assert info.value.code == code


def test_oversized_command() -> None:
    with pytest.raises(OperationError, match="longer than") as info:
        CommandChecker().check_request(req("echo " + "a" * 70_000))
    assert info.value.code == "invalid_argument"


ALLOW = frozenset({"ls", "cat", "echo", "export"})
KEYWORD = (
    "shell keyword {!r} is not allowed while an allowlist is set; "
    "run simple commands joined by ';', '&&', '||' or '|'"
)
PATH_DENIED = (
    "environment variable 'PATH' is not allowed (PATH cannot be changed while an allowlist is set)"
)


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("curl x", "command 'curl' is not in the allowed commands"),
        ("./curl x", "command './curl' is not in the allowed commands"),
        ("/usr/bin/curl x", "command '/usr/bin/curl' is not in the allowed commands"),
        ("/bin/ls", "command '/bin/ls' names a path; run the allowed command 'ls' by name instead"),
        ("./ls", "command './ls' names a path; run the allowed command 'ls' by name instead"),
        ("LS", "command 'LS' is not in the allowed commands"),
    ],
)
def test_allowlist_in_argv_mode(command: str, message: str) -> None:
    assert denied(CommandChecker(), req(command, allowed_commands=ALLOW)) == message


def test_allowlist_exact_path_entry_is_allowed() -> None:
    guard = CommandChecker()
    assert guard.check_command(req("/bin/ls -l", allowed_commands={"/bin/ls"})) == ["/bin/ls", "-l"]
    assert guard.check_command(req("ls -l", allowed_commands=ALLOW)) == ["ls", "-l"]


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("ls | curl x", "command 'curl' is not in the allowed commands"),
        ("ls && curl x", "command 'curl' is not in the allowed commands"),
        ("ls; curl x", "command 'curl' is not in the allowed commands"),
        ("ls & curl x", "command 'curl' is not in the allowed commands"),
        ("ls\ncurl x", "command 'curl' is not in the allowed commands"),
        (">out curl x", "command 'curl' is not in the allowed commands"),
        ("ls || 'cu'\"rl\" x", "command 'curl' is not in the allowed commands"),
        ("X=1 curl", "command 'curl' is not in the allowed commands"),
        ("2>/dev/null curl", "command 'curl' is not in the allowed commands"),
        ("if true; then ls; fi", KEYWORD.format("if")),
        ("{ curl; }", KEYWORD.format("{")),
        ("echo $(curl x)", "command substitution ('$(') is not allowed while an allowlist is set"),
        ("echo `curl x`", "command substitution ('`') is not allowed while an allowlist is set"),
        (
            'echo "$(curl x)"',
            "command substitution ('$(') is not allowed while an allowlist is set",
        ),
        (
            "cat <<EOF\n$(curl x)\nEOF",
            "command substitution ('$(') is not allowed while an allowlist is set",
        ),
        (
            "(curl)",
            "subshells and function definitions ('(') are not allowed while an allowlist is set",
        ),
        (
            "f() { curl; }; f",
            "subshells and function definitions ('(') are not allowed while an allowlist is set",
        ),
        (
            "ls > >(curl)",
            "subshells and function definitions ('(') are not allowed while an allowlist is set",
        ),
        ("$X a", "command name '$X' must be a literal word while an allowlist is set"),
        ("l? a", "command name 'l?' must be a literal word while an allowlist is set"),
        (
            "PATH=/tmp ls",
            PATH_DENIED,
        ),
        (
            "LD_PRELOAD=/x.so ls",
            "environment variable 'LD_PRELOAD' is not allowed (dynamic loader variable)",
        ),
        (
            "export PATH=.; ls",
            PATH_DENIED,
        ),
    ],
)
def test_allowlist_in_shell_mode_checks_every_simple_command(command: str, message: str) -> None:
    assert (
        denied(CommandChecker(), req(command, allowed_commands=ALLOW, allow_shell_syntax=True))
        == message
    )


@pytest.mark.parametrize(
    "builtin", ["eval", "exec", "source", ".", "command", "builtin", "trap", "alias"]
)
def test_unsafe_builtins_refused_even_when_listed(builtin: str) -> None:
    allowed = ALLOW | {builtin}
    message = denied(
        CommandChecker(), req(f"{builtin} curl", allowed_commands=allowed, allow_shell_syntax=True)
    )
    assert message == f"built-in {builtin!r} is not allowed while an allowlist is set"


@pytest.mark.parametrize(
    "command",
    [
        "ls -l | cat > out.txt 2>&1",
        "echo *.py; ls '$(not run)'",
        "cat <<'EOF'\n$(literal) curl\nEOF\nls",
        "X=1 ls && echo $X",
    ],
)
def test_allowlist_shell_mode_accepts_listed_pipelines(command: str) -> None:
    argv = CommandChecker().check_command(
        req(command, allowed_commands=ALLOW, allow_shell_syntax=True)
    )
    assert argv == ["sh", "-c", command]


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("LD_PRELOAD", "dynamic loader variable"),
        ("Ld_Preload", "dynamic loader variable"),
        ("LD_LIBRARY_PATH", "dynamic loader variable"),
        ("DYLD_INSERT_LIBRARIES", "dynamic loader variable"),
        ("GLIBC_TUNABLES", "dynamic loader variable"),
        ("PYTHONPATH", "interpreter start-up variable"),
        ("PYTHONSTARTUP", "interpreter start-up variable"),
        ("NODE_OPTIONS", "interpreter start-up variable"),
        ("PERL5OPT", "interpreter start-up variable"),
        ("BASH_ENV", "shell start-up variable"),
        ("ENV", "shell start-up variable"),
        ("PROMPT_COMMAND", "shell start-up variable"),
        ("BASH_FUNC_ls%%", "not a valid variable name"),
        ("IFS", "shell start-up variable"),
        ("GIT_SSH_COMMAND", "git variable"),
        ("git_dir", "git variable"),
        ("SSH_AUTH_SOCK", "agent socket variable"),
        ("AWS_SECRET_ACCESS_KEY", "credential-like variable"),
        ("OPENAI_API_KEY", "credential-like variable"),
        ("github_token", "credential-like variable"),
        ("DB_PASSWORD", "credential-like variable"),
        ("MY_CREDENTIALS", "credential-like variable"),
        ("HTTP_AUTHORIZATION", "credential-like variable"),
        ("A=B", "not a valid variable name"),
        ("", "not a valid variable name"),
    ],
)
def test_env_denylist(name: str, reason: str) -> None:
    assert denied_reason(name) == reason
    secret_value = "s3cr3t-value-never-shown"
    message = denied(CommandChecker(), req("ls", env={name: secret_value}))
    assert message == f"environment variable {name!r} is not allowed ({reason})"
    assert secret_value not in message


@pytest.mark.parametrize("name", ["FOO", "LANG", "TERM", "MY_SETTING", "HOME", "TZ", "PATH"])
def test_env_allowed(name: str) -> None:
    guarded = CommandChecker().check_request(req("ls", env={name: "v"}))
    assert guarded.env == {name: "v"}


def test_path_env_refused_with_allowlist() -> None:
    message = denied(CommandChecker(), req("ls", env={"PATH": "/tmp"}, allowed_commands=ALLOW))
    assert "PATH cannot be changed while an allowlist is set" in message


def test_check_env_direct() -> None:
    guard = CommandChecker()
    assert guard.check_env({"A": "1"}) == {"A": "1"}
    with pytest.raises(OperationError) as info:
        guard.check_env({"LD_PRELOAD": "x"})
    assert info.value.code == "policy_denied"
    with pytest.raises(OperationError) as info:
        guard.check_env({"A": "x\x00y"})
    assert info.value.code == "invalid_argument"


def test_sanitize_path_drops_relative_entries() -> None:
    assert sanitize_path("/usr/bin::.:bin:/bin:/usr/bin") == "/usr/bin:/bin"
    assert sanitize_path("") == "/usr/local/bin:/usr/bin:/bin"


@pytest.mark.parametrize("cwd", ["..", "/../x", "a/../../b"])
def test_cwd_lexical_escape(cwd: str) -> None:
    with pytest.raises(OperationError) as info:
        CommandChecker().check_request(req("ls", cwd=cwd))
    assert info.value.code == "invalid_path"


def test_cwd_helpers(tmp_path: Path) -> None:
    assert CommandChecker.relative_cwd(None) == "."
    assert CommandChecker.relative_cwd("/a/./b/") == "a/b"
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    (tmp_path / "out").symlink_to("/etc")
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = CommandChecker.open_cwd(root, "/d")
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "d"))
        os.close(fd)
        for cwd, code in [
            ("/nope", "not_found"),
            ("/f", "not_a_directory"),
            ("/out", "invalid_path"),
        ]:
            with pytest.raises(OperationError) as info:
                CommandChecker.open_cwd(root, cwd)
            assert info.value.code == code, cwd
    finally:
        os.close(root)


def test_audit_records_accepted_and_rejected(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="corral.shell.audit")
    guard = CommandChecker()
    guard.check_request(req("ls -l", env={"FOO": "hidden-value"}))
    with pytest.raises(OperationError):
        guard.check_request(req("curl x", allowed_commands=ALLOW))
    records = [r for r in caplog.records if r.name == "corral.shell.audit"]
    assert [r.levelno for r in records] == [logging.INFO, logging.WARNING]
    assert "accepted command='ls -l'" in records[0].getMessage()
    assert "FOO" in records[0].getMessage()
    assert "hidden-value" not in records[0].getMessage()
    assert records[1].getMessage() == (
        "rejected command='curl x' reason=command 'curl' is not in the allowed commands"
    )
    assert records[1].corral_audit["event"] == "rejected"  # type: ignore[attr-defined]


def test_audit_log_line_injection_is_neutralised(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="corral.shell.audit")
    CommandChecker().check_request(req("echo 'a\nrejected command=fake'", allow_shell_syntax=True))
    (record,) = caplog.records
    assert "\n" not in record.getMessage()


def test_audit_rate_limit(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.audit")
    now = [0.0]
    audit = AuditLog(logging.getLogger("test.audit"), 3, clock=lambda: now[0])
    for i in range(10):
        audit.rejected(f"cmd{i}", "r")
    assert len(caplog.records) == 3
    assert audit.suppressed_total == 7
    now[0] = 20.0  # one token back (3 a minute)
    audit.accepted("later", "/", [])
    messages = [r.getMessage() for r in caplog.records]
    assert messages[3] == "7 shell audit records suppressed by the rate limit"
    assert messages[4].startswith("accepted command='later'")


def test_audit_rate_limit_via_guard(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="corral.shell.audit")
    guard = CommandChecker(audit_max_per_minute=5)
    for _ in range(50):
        guard.check_request(req("ls"))
    assert len(caplog.records) == 5
    assert guard.audit.suppressed_total == 45


@settings(max_examples=80, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("ab |&;<>()$`*?[]'\"\\\n#~=")), min_size=1, max_size=24)
)
def test_argv_mode_splits_exactly_like_sh(command: str) -> None:
    """Differential check against the real /bin/sh: whatever argv mode
    accepts, sh would split into the very same words (so refusing shell
    syntax loses nothing and no operator sneaks through as an argument)."""
    try:
        argv = CommandChecker().check_command(req("x " + command))
    except OperationError as exc:
        codes = {exc.code}
        assert codes <= {"policy_denied", "invalid_argument"}
        return
    script = f"set -- x {command}\nprintf '%s\\0' \"$@\""
    out = subprocess.run(["sh", "-c", script], capture_output=True, check=True).stdout
    assert argv == out.decode().split("\0")[:-1]
