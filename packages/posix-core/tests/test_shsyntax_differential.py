"""Differential test: the guard's reading of a script against what real shells run.

With an allowlist and shell syntax allowed, the guard accepts ``sh -c SCRIPT``
only if every command word the lexer finds is allowed. That is sound only if
no shell runs a program the lexer did not report. This test generates scripts
over a small shell grammar (simple commands, pipes, lists, redirections,
here-documents with every kind of delimiter, quoting, comments, line
continuations, subshells, braces, keywords, function definitions, odd
characters) and, for every script the guard *accepts*, runs it through each
shell available here (dash, bash in POSIX mode, busybox ash).

The oracle does not trace the shell (``set -x`` output can be forged by the
script itself and misses nothing-printing paths): every external program name
the grammar can produce resolves, through a ``PATH`` holding only one
directory, to a stub that appends its own name to a log file outside the
script's reach (the script never learns the path, and the grammar has no
``PATH`` change, ``cd``, ``exec`` or absolute names). A program can only run
by being executed, and executing it writes the log; builtins (``echo``,
``true``) cannot run other programs. The test fails when a logged name is
not allowed (a bypass) or was not among the command words the lexer reported
(a misreading that a luckier allowlist would turn into a bypass).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from corral.provider import CommandRequest, OperationError
from corral_posix import CommandChecker
from corral_posix._checker import allowlist_programs

ALLOWED = frozenset({"ls", "echo", "cat", "wc", "tool", "true"})
DENIED = ("touch", "curl", "evil", "S1")
# echo stays the shell's builtin. busybox runs its applets (ls, cat, wc,
# touch) without a PATH lookup, so "tool", "curl" and "evil", which are no
# applets, keep the oracle sighted on busybox too.
EXTERNAL = ("ls", "cat", "wc", "tool", *DENIED)

_SHELLS = [
    argv
    for argv, exe in (
        (["dash", "-c"], "dash"),
        (["bash", "--posix", "-c"], "bash"),
        (["busybox", "sh", "-c"], "busybox"),
        (["sh", "-c"], "sh"),
    )
    if shutil.which(exe)
]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(bin dir of stubs, log file, working directory) shared by every example."""
    base = tmp_path_factory.mktemp("shdiff")
    bindir, log, work = base / "bin", base / "ran.log", base / "work"
    bindir.mkdir()
    work.mkdir()
    for name in EXTERNAL:
        stub = bindir / name
        stub.write_text(f"#!/bin/sh\nprintf '%s\\n' {name} >> '{log}'\n")
        stub.chmod(0o755)
    return bindir, log, work


def run_everywhere(script: str, sandbox: tuple[Path, Path, Path]) -> dict[str, list[str]]:
    """Which stubbed programs each shell ran for ``script``."""
    bindir, log, work = sandbox
    ran: dict[str, list[str]] = {}
    for argv in _SHELLS:
        log.write_text("")
        for entry in work.iterdir():
            if entry.is_file():
                entry.unlink()
        try:
            subprocess.run(
                [shutil.which(argv[0]) or argv[0], *argv[1:], script],
                env={"PATH": str(bindir), "LC_ALL": "C.UTF-8"},
                cwd=work,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
                check=False,
            )
        except subprocess.TimeoutExpired:
            ran[argv[0]] = ["<timeout>"]
            continue
        ran[argv[0]] = log.read_text().split()
    return ran


# -- the grammar ---------------------------------------------------------------
# Weighted toward what the guard accepts (repeats in a sampled list raise
# its odds): a script the guard refuses proves nothing, the interesting ones
# are those it accepts while hiding a denied name somewhere a shell might
# read as a command. The constructs it refuses stay in, rarer, so a
# regression that starts accepting them is caught too.

_PLAIN_WORDS = ["a", "-l", "x.txt", "A", "A=1", "done", "in", "B", "{", "}", "!", "if", "fi"]
_TRICKY_WORDS = [  # accepted by the guard, hiding operators and names
    "'a;evil'",
    '"a|evil"',
    "a\\;evil",
    "a\\&\\&evil",
    "'#'",
    '"#"',
    "\\#",
    "x#y",
    "x#;evil",
    '"a\'b"',
    "'a\"b'",
    '"\\""',
    '"\\\\"',
    'a\\"b',
    "a\\'b",
    '"${X}"',
    "${X}",
    "${X:-a}",
    "${#X}",
    "$X",
    '"$X"',
    "~",
    "*.txt",
    "[ab]",
    "a\u00a0b",
    "a\u2003;evil",
    "a\rb",
    "\r",
    "A\r",
    "'a\nevil'",
    '"a\nevil"',
    '"\\\nevil"',
    "'<<A'",
    "\\<<A",
    "=",
    "X=$X",
]
_REFUSED_WORDS = [  # refused while an allowlist is set, or unbalanced
    "${X:-'a b'}",
    "${X:-<<A}",
    "$'a\\' b'",
    "$'\\''",
    '$"a"',
    "$(evil)",
    "`evil`",
    "x\\",
    "'",
    '"',
    "\\\n",
]
_ALLOWED_NAMES = ["ls", "echo", "cat", "wc", "tool", "true", "X=1 ls", "2>f ls", ">f tool"]
_DENIED_NAMES = ["touch", "curl", "evil", "S1", "X=1 evil", ">f evil"]
_KEYWORDS = ["!", "{", "if", "then", "case", "for", "while", "do", "time", "function", "[["]
_REDIRECTS = [">f", "2>&1", "> f", "<f", "10>f", "2>f", ">>f", "<>f", ">&2", "<&-", ">|f"]
_DELIMS = [
    "A",
    "'A'",
    '"A"',
    "A",
    "'A'",
    '"A"',
    "A.1",
    "A B",
    '"A B"',
    "'A B'",
    'A"B"',
    "\\A",
    '""',
    "$X",
    "A\\ B",
]
_SEPARATORS = [
    "; ",
    ";",
    " && ",
    " || ",
    " | ",
    " & ",
    "\n",
    "&",
    "|",
    "\n\n",
    ";\n# c\n",
    " #c\n",
    " \\\n",
    ";;",
]


def _weighted(*choices: tuple[int, st.SearchStrategy[str]]) -> st.SearchStrategy[str]:
    """One of several strategies, each drawn about ``weight`` times as often."""
    return st.sampled_from([s for weight, s in choices for _ in range(weight)]).flatmap(
        lambda chosen: chosen
    )


words = _weighted(
    (4, st.sampled_from(_PLAIN_WORDS)),
    (6, st.sampled_from(_TRICKY_WORDS)),
    (1, st.sampled_from(_REFUSED_WORDS)),
)
names = _weighted((6, st.sampled_from(_ALLOWED_NAMES)), (1, st.sampled_from(_DENIED_NAMES)))
keyword_prefix = _weighted((8, st.just("")), (1, st.sampled_from([f"{k} " for k in _KEYWORDS])))
simple = st.builds(
    lambda prefix, name, args, redir: prefix + " ".join([name, *args, *redir]),
    keyword_prefix,
    names,
    st.lists(words, max_size=3),
    st.lists(st.sampled_from(_REDIRECTS), max_size=1),
)


def _grouped(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    forms = [
        "( {} )",
        "{{ {}; }}",
        "if true; then {}; fi",
        "! {}",
        "case a in a) {};; esac",
        "for i in a; do {}; done",
        "f() {{ {}; }}; f",
        "while false; do {}; done",
        "time {}",
        "{} # {}",
    ]
    return st.builds(
        lambda form, body: form.replace("{}", body, 1).replace("{}", "x", 1),
        st.sampled_from(forms),
        inner,
    )


commands = _weighted((8, simple), (1, st.recursive(simple, _grouped, max_leaves=2)))
lists = st.builds(
    lambda first, rest: first + "".join(sep + cmd for sep, cmd in rest),
    commands,
    st.lists(st.tuples(st.sampled_from(_SEPARATORS), commands), max_size=3),
)
_NEAR_DELIMITERS = [
    "A",
    "A ",
    " A",
    "\tA",
    "A\r",
    "'A'",
    '"A"',
    "A;",
    "A#",
    "A\\",
    "AB",
    "A B",
    "A.1",
    "\\",
    "B",
]
body_lines = st.lists(
    _weighted(
        (2, commands),
        (3, st.sampled_from(_NEAR_DELIMITERS)),
        (1, st.sampled_from(["evil S1", "touch S1", "$X", "x\\"])),
    ),
    max_size=4,
)


@st.composite
def scripts(draw: st.DrawFn) -> str:
    """A list, possibly with a here-document whose body mixes commands and
    lines that look like (or are) the delimiter under some reading."""
    head = draw(lists)
    if not draw(st.booleans()):
        return head
    op = draw(st.sampled_from(["<<", "<<-", "<< ", "<<", "<<-", "<<", "<<<", "0<<"]))
    delim = draw(st.sampled_from(_DELIMS))
    tail = draw(st.sampled_from(["", " ; evil S1", " | tool", " # c", " <<B", " && ls"]))
    lines = draw(body_lines)
    if draw(st.integers(0, 3)):  # mostly end the body where sh would
        bare = delim.strip("'\"")
        lines.insert(draw(st.integers(0, len(lines))), "\t" + bare if op == "<<-" else bare)
    after = draw(lists)
    end = draw(st.sampled_from(["\n", "", "\nA\n", "\nB\n"]))
    return f"{head} {op}{delim}{tail}\n" + "".join(f"{line}\n" for line in lines) + after + end


# -- the property ----------------------------------------------------------------


def guard_reading(script: str) -> set[str] | None:
    """The command words the guard checked, or None if it refused the script."""
    request = CommandRequest(script, allowed_commands=ALLOWED, allow_shell_syntax=True)
    try:
        CommandChecker().check_command(request)
    except OperationError as exc:
        refused = exc
    else:
        return {program.text for program, _args in allowlist_programs(script)}
    assert refused.code in {"policy_denied", "invalid_argument"}
    return None


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(script=scripts())
@example(script='ls <<"A B"\nA B\ntouch S1')  # the reported bypass (issue 11, item 9)
@example(script="cat <<A\nA\\\nB\nA\nB\nls\ntouch S1\n")  # bash joins "A\" + "B"?
@example(script="cat <<A\nE\\\nA\ntouch S1\nA\n")
@example(script="cat <<<A\ntouch S1\n")  # a here-string in bash, no body
@example(script="echo ${X:-<<A}\ntouch S1\nA\n")  # '<<' inside braces is not a here-document
@example(script="echo $'\\'' ; touch S1 ; echo '\\''")
@example(script="ls \\\n; touch S1")
@example(script="ls 10>f touch")
def test_no_shell_runs_a_program_the_guard_did_not_check(
    script: str, sandbox: tuple[Path, Path, Path]
) -> None:
    reported = guard_reading(script)
    if reported is None:
        return  # refused: nothing runs, always safe
    for shell, ran in run_everywhere(script, sandbox).items():
        bypass = [name for name in ran if name not in ALLOWED]
        assert not bypass, f"{shell} ran {bypass} though the guard accepted {script!r}"
        unseen = [name for name in ran if name not in reported]
        assert not unseen, f"{shell} ran {unseen}; the lexer saw only {sorted(reported)}"


def test_the_oracle_sees_a_program_hidden_from_a_naive_reading(
    sandbox: tuple[Path, Path, Path],
) -> None:
    """The oracle itself can fail: it reports the here-document bypass of the
    old lexer (which cut ``"A B"`` at the blank and took ``touch`` for body)."""
    ran = run_everywhere('tool <<"A B"\nA B\nevil S1', sandbox)
    assert ran
    assert all(names == ["tool", "evil"] for names in ran.values()), ran


@pytest.mark.parametrize(
    "script",
    [
        "cat <<'EOF'\n$(literal) curl\nEOF\nls",
        'cat <<"EOF"\nbody\nEOF\nls | wc -l',
        "cat <<-EOF\n\tbody\n\tEOF\necho ${X:-default} done",
        "ls -l > out 2>&1; echo a && cat f || echo b",
    ],
)
def test_ordinary_scripts_stay_accepted(script: str, sandbox: tuple[Path, Path, Path]) -> None:
    """The refusals are narrow: the common forms still pass and agree with sh."""
    reported = guard_reading(script)
    assert reported is not None
    for ran in run_everywhere(script, sandbox).values():
        assert set(ran) <= reported


@pytest.mark.parametrize(
    "script",
    [
        'ls <<"A B"\nA B\ntouch S1',
        "ls <<'A B'\nA B\ntouch S1",
        'ls <<A"B"\nAB\ntouch S1',
        "ls <<\\A\nA\ntouch S1",
        "ls <<$X\n$X\ntouch S1",
        "ls <<<A\ntouch S1",
        "ls <<A",
        "ls <<A\nbody",
        "ls <<A\nE\\\nA\ntouch S1\nA",
        "ls \\\n; echo",
        "echo a\\",
        "echo $'a'",
        'echo $"a"',
        "echo ${X:-'a'}",
        "echo ${X:-<<A}",
        "time ls",
        "! ls",
    ],
)
def test_unreadable_constructs_are_refused(script: str) -> None:
    request = CommandRequest(script, allowed_commands=ALLOWED, allow_shell_syntax=True)
    with pytest.raises(OperationError) as info:
        CommandChecker().check_command(request)
    assert info.value.code == "policy_denied"
    assert "touch" not in info.value.message  # never echoes the script


def test_without_allowlist_the_constructs_still_run() -> None:
    """The refusals only apply while an allowlist is set."""
    script = 'cat <<"A B"\nA B\n'
    argv = CommandChecker().check_command(CommandRequest(script, allow_shell_syntax=True))
    assert argv == ["sh", "-c", script]


def test_shells_are_available() -> None:
    assert _SHELLS, "no POSIX shell to compare the lexer against"
    assert os.path.exists("/bin/sh")
