"""CommandChecker's fast paths give exactly the decisions of the full checks."""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.provider import CommandRequest, OperationError
from corral_posix import CommandChecker
from corral_posix._audit import AuditLog
from corral_posix._checker import _split_argv, _split_plain
from corral_posix._env import denied_reason
from corral_posix._resolve import open_beneath

Outcome = tuple[str, ...]

_PLAIN_CHARS = "abcXYZ019_./:=+,@%-"
# Everything the lexer, shlex or sh treat specially, other whitespace, and
# non-ASCII (including Unicode blanks that str.split() would split on).
_SPECIAL_CHARS = "'\"\\|&;<>()$`*?[]{}!#~^\n\r\x0b\x0c\x1c\x85\u00a0\u2028\u3000é\u00df"
_ALLOW = frozenset({"ls", "a", "b.c", "/bin/ls", "x=1"})


def _outcome(command: str, allowed: frozenset[str] | None, *, fast: bool) -> Outcome:
    request = CommandRequest(command, allowed_commands=allowed)
    guard = CommandChecker(audit_logger=logging.getLogger("test.fastpath.audit"))
    with pytest.MonkeyPatch.context() as patch:
        if not fast:
            patch.setattr("corral_posix._checker._split_plain", lambda _command: None)
        try:
            return ("ok", *guard.check_command(request))
        except OperationError as exc:
            return ("error", exc.code, exc.message)


_words = st.lists(
    st.one_of(
        st.text(alphabet=_PLAIN_CHARS, max_size=6),
        st.text(alphabet=_PLAIN_CHARS + _SPECIAL_CHARS, max_size=6),
        st.sampled_from(["ls", "a", "b.c", "/bin/ls", "x=1", "-n", "--", "", "''", '""']),
    ),
    max_size=5,
)
_blanks = st.text(alphabet=" \t", min_size=1, max_size=2)


@settings(max_examples=100, deadline=None)
@given(
    words=_words,
    seps=st.lists(_blanks, min_size=6, max_size=6),
    allowed=st.sampled_from([None, _ALLOW]),
)
def test_fast_path_decides_like_full_path(
    words: list[str], seps: list[str], allowed: frozenset[str] | None
) -> None:
    command = seps[0] + "".join(w + s for w, s in zip(words, seps[1:], strict=False))
    assert _outcome(command, allowed, fast=True) == _outcome(command, allowed, fast=False)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=_PLAIN_CHARS + _SPECIAL_CHARS + " \t", max_size=20))
def test_fast_split_equals_full_split(command: str) -> None:
    fast = _split_plain(command)
    if fast is not None:
        assert fast == _split_argv(command)
    assert _outcome(command, None, fast=True) == _outcome(command, None, fast=False)


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ("true", ["true"]),
        ("  ls\t-la  a/b.c  ", ["ls", "-la", "a/b.c"]),
        ("x=1 --opt=v,w@h:1%2+3", ["x=1", "--opt=v,w@h:1%2+3"]),
    ],
)
def test_fast_path_taken_for_plain_commands(command: str, argv: list[str]) -> None:
    assert _split_plain(command) == argv


@pytest.mark.parametrize(
    "command",
    [
        "echo 'a b'",
        'echo "a"',
        "echo a\\ b",
        "ls | wc",
        "echo $X",
        "ls *",
        "a #b",
        "ls ~",
        "a\rb",
        "a\u00a0b",
        "a\u3000b",
        "é",
        "a\nb",
        "a {b,c}",
    ],
)
def test_fast_path_declines_anything_special(command: str) -> None:
    assert _split_plain(command) is None


def test_root_cwd_opens_the_root_itself(tmp_path: Path) -> None:
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for cwd in (None, "/", ".", "/./"):
            fd = CommandChecker.open_cwd(root, cwd)
            try:
                assert os.path.samestat(os.fstat(fd), os.fstat(root))
                assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
                assert fd != root
            finally:
                os.close(fd)
    finally:
        os.close(root)


def test_root_cwd_on_a_file_fails_like_open_beneath(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    not_dir = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        with pytest.raises(OperationError) as fast:
            CommandChecker.open_cwd(not_dir, None)
        with pytest.raises(OperationError) as full:
            open_beneath(not_dir, (), os.O_RDONLY | os.O_DIRECTORY, follow_leaf=True)
        assert (fast.value.code, fast.value.message) == (full.value.code, full.value.message)
        assert fast.value.code == "not_a_directory"
    finally:
        os.close(not_dir)


def test_audit_budget_is_spent_even_when_info_is_disabled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="test.quiet.audit")
    now = [0.0]
    audit = AuditLog(logging.getLogger("test.quiet.audit"), 3, clock=lambda: now[0])
    for i in range(3):
        audit.accepted(f"ok{i}", "/", ["B", "A"])
    assert caplog.records == []  # INFO is off: nothing formatted, nothing logged
    audit.rejected("bad", "rule")
    assert caplog.records == []
    assert audit.suppressed_total == 1
    now[0] = 20.0  # one token back (3 a minute)
    audit.rejected("bad2", "rule2")
    assert [r.getMessage() for r in caplog.records] == [
        "1 shell audit records suppressed by the rate limit",
        "rejected command='bad2' reason=rule2",
    ]


def test_guard_accepts_dict_env_names_sorted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.env.audit")
    guard = CommandChecker(audit_logger=logging.getLogger("test.env.audit"))
    guard.check_request(CommandRequest("ls", env={"ZED": "1", "ALPHA": "2"}))
    (record,) = caplog.records
    assert record.corral_audit["env"] == ["ALPHA", "ZED"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("A" * 200 + "_KEY", "credential-like variable"),
        ("ld_" + "x" * 300, "dynamic loader variable"),
        ("Ld_Preload", "dynamic loader variable"),
        ("1" + "A" * 129, "not a valid variable name"),
        ("B" * 300, None),
    ],
)
def test_denied_reason_same_for_short_and_long_names(name: str, reason: str | None) -> None:
    assert denied_reason(name) == reason
    assert denied_reason(name) == reason  # a second call may come from the cache


@pytest.mark.parametrize("command", ["ls\r-rf", "ls \r", "\rls"])
def test_carriage_return_is_refused_in_argv_mode(command: str) -> None:
    guard = CommandChecker()
    with pytest.raises(OperationError) as info:
        guard.check_command(CommandRequest(command))
    assert info.value.code == "invalid_argument"
    assert "carriage return" in info.value.message
