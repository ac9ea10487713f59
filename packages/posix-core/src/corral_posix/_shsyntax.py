"""A small POSIX shell lexer: enough to find shell syntax and simple commands.

It is not a shell parser.  It finds (1) every place a string uses shell
syntax (operators, expansions, globs, comments, tilde) and (2) the simple
commands of a list of pipelines, so an allowlist can be checked against each
program.  Constructs it does not understand are reported as findings and
refused by the guard rather than guessed at.

An allowlist is only as good as this lexer's agreement with ``sh`` about
where commands start.  Wherever the shells a workspace may run (dash, bash
in POSIX mode, busybox ash) read a construct differently from each other or
from this lexer, it is reported as an ``unsupported`` finding, which the
guard refuses while an allowlist is set: here-document delimiters other
than a plain word (optionally quoted as a whole), here-documents whose end
line is missing, body lines ending in a backslash, line continuations, a
trailing backslash, ``$'...'``/``$"..."`` quoting and ``${...}`` holding
quotes, escapes or nested expansions.  A differential test runs generated
scripts through the real shells and fails if any of them runs a program
the lexer did not report.
"""

from __future__ import annotations

import re
from typing import Final

import attrs

__all__ = ["Finding", "Lexed", "Word", "lex", "split_simple_commands"]

_OPERATORS: Final = (
    "<<-",
    "&&",
    "||",
    ";;",
    "<<",
    ">>",
    "<&",
    ">&",
    "<>",
    ">|",
    "|",
    "&",
    ";",
    "<",
    ">",
    "(",
    ")",
)
_OPERATOR_CHARS: Final = frozenset("|&;<>()")
# Runs of characters that mean nothing to the lexer inside a word (a '#' or
# '~' is special only at the start of one, which the caller handles first),
# and inside double quotes; consumed in one step instead of one by one.
_ORDINARY_RUN: Final = re.compile(r"[^ \t\n\\'\"|&;<>()$`*?\[]+")
_DQUOTED_RUN: Final = re.compile(r"[^\"\\$`]+")
REDIRECTIONS: Final = frozenset({"<", ">", "<<", ">>", "<&", ">&", "<>", ">|", "<<-"})
SEPARATORS: Final = frozenset({"|", "||", "&&", ";", "&", "\n", ";;"})

_DESCRIPTIONS: Final = {
    "|": "pipe",
    "&": "background or '&&' list",
    ";": "command separator",
    "<": "redirection",
    ">": "redirection",
    "(": "subshell",
    ")": "subshell",
    "\n": "newline",
    "$": "variable expansion",
    "`": "command substitution",
    "$(": "command substitution",
    "*": "glob",
    "?": "glob",
    "[": "glob",
    "#": "comment",
    "~": "home directory expansion",
    "<<": "here-document",
}

# A here-document delimiter every shell reads the same way: a plain word,
# alone or quoted as a whole ('EOF' or "EOF"). Partial quoting, blanks,
# backslashes and expansions are read differently by different shells.
_DELIMITER: Final = re.compile(r"(?P<q>['\"]?)[A-Za-z0-9_.+@%:,=-]+(?P=q)")
_IO_NUMBER: Final = re.compile(r"[0-9]")
_DELIMITER_END: Final = frozenset(" \t\n") | frozenset("|&;<>()")
# ${NAME}, ${NAME:-word} and friends, without anything that nests or quotes.
# No blanks, quotes, escapes, operators or nested expansions: the lexer reads
# the word exactly as sh does (a '<<' inside braces is not a here-document).
_SIMPLE_BRACED: Final = re.compile(r"\$\{[A-Za-z0-9_#?@*!:=+%./,-]*\}")


class ShellSyntaxError(ValueError):
    """The command cannot be lexed (an unterminated quote)."""


@attrs.frozen
class Finding:
    """One use of shell syntax: the character(s) and what they mean.

    ``kind`` is ``"syntax"``, ``"glob"``, ``"substitution"`` or
    ``"unsupported"`` (a construct the lexer cannot read exactly as every
    ``sh`` does; ``note`` then says which, in words of our own, never the
    command's text).
    """

    text: str
    kind: str
    note: str = ""

    @property
    def description(self) -> str:
        """Human name of the construct, e.g. ``pipe``."""
        return self.note or _DESCRIPTIONS.get(self.text, "shell syntax")


@attrs.frozen
class Word:
    """A word after quote removal, or an operator (``op=True``)."""

    text: str
    op: bool = False
    dynamic: bool = False  # holds an unquoted or double-quoted ``$`` or a backtick
    glob: bool = False  # holds an unquoted ``*``, ``?`` or ``[``
    quoted: bool = False
    io_number: bool = False  # digits glued to a following redirection, like ``2>``


@attrs.frozen
class Lexed:
    """Words and operators, and every shell-syntax finding in order."""

    words: tuple[Word, ...]
    findings: tuple[Finding, ...]


def lex(command: str) -> Lexed:  # noqa: PLR0915 -- one state machine reads best whole
    """Split ``command`` the way ``sh`` would, recording shell syntax.

    Raises:
        ShellSyntaxError: A quote is not closed.
    """
    words: list[Word] = []
    findings: list[Finding] = []
    buf: list[str] | None = None
    flags = {"dynamic": False, "glob": False, "quoted": False}
    heredocs: list[tuple[str, bool, bool]] = []
    i, n = 0, len(command)

    def finish(io_number: bool = False) -> None:
        nonlocal buf
        if buf is not None:
            words.append(Word("".join(buf), io_number=io_number, **flags))
            buf = None
            flags.update(dynamic=False, glob=False, quoted=False)

    def start() -> list[str]:
        nonlocal buf
        if buf is None:
            buf = []
        return buf

    while i < n:
        c = command[i]
        if c in " \t":
            finish()
            i += 1
        elif c == "\n":
            finish()
            words.append(Word("\n", op=True))
            findings.append(Finding("\n", "syntax"))
            i = _skip_heredocs(command, i + 1, heredocs, findings)
            heredocs.clear()
        elif c == "\\":
            if command[i + 1 : i + 2] == "\n":
                # Shells join the lines before anything else; where that
                # lands (an operator, a here-document line) differs.
                findings.append(Finding("\n", "syntax"))
                findings.append(Finding("\\", "unsupported", "a line continuation"))
                i += 2
                continue
            if i + 1 == n:
                findings.append(Finding("\\", "unsupported", "a backslash at the end"))
            start().append(command[i + 1 : i + 2] or "\\")
            flags["quoted"] = True
            i += 2
        elif c == "'":
            end = command.find("'", i + 1)
            if end < 0:
                raise ShellSyntaxError("command has an unterminated single quote")
            start().append(command[i + 1 : end])
            flags["quoted"] = True
            i = end + 1
        elif c == '"':
            i = _double_quoted(command, i + 1, start(), findings, flags)
            flags["quoted"] = True
        elif c in _OPERATOR_CHARS:
            # One ASCII digit: dash reads "10>x" as the word 10 and a redirection.
            io = (
                buf is not None
                and c in "<>"
                and not flags["quoted"]
                and _IO_NUMBER.fullmatch("".join(buf)) is not None
            )
            finish(io_number=io)
            op = next(o for o in _OPERATORS if command.startswith(o, i))
            words.append(Word(op, op=True))
            findings.append(Finding(c, "syntax"))
            i += len(op)
            if op in ("<<", "<<-"):
                i = _heredoc_word(command, i, op == "<<-", heredocs, findings)
        elif c == "$":
            _dollar(command, i, findings)
            start().append(c)
            flags["dynamic"] = True
            i += 1
        elif c == "`":
            findings.append(Finding("`", "substitution"))
            start().append(c)
            flags["dynamic"] = True
            i += 1
        elif c in "*?[":
            findings.append(Finding(c, "glob"))
            start().append(c)
            flags["glob"] = True
            i += 1
        elif c in "#~" and buf is None:
            findings.append(Finding(c, "syntax"))
            if c == "#":
                end = command.find("\n", i)
                i = n if end < 0 else end
            else:
                start().append(c)
                i += 1
        else:
            run = _ORDINARY_RUN.match(command, i)
            end = i + 1 if run is None else run.end()
            start().append(command[i:end])
            i = end
    finish()
    if heredocs:
        findings.append(Finding("<<", "unsupported", "a here-document without its end line"))
    return Lexed(tuple(words), tuple(findings))


def _dollar(command: str, i: int, findings: list[Finding]) -> None:
    """Record the finding of the ``$`` at ``i`` (unquoted or in double quotes)."""
    nxt = command[i + 1 : i + 2]
    if nxt == "(":
        findings.append(Finding("$(", "substitution"))
        return
    findings.append(Finding("$", "syntax"))
    if nxt in ("'", '"'):
        # bash reads $'..' (with \' inside) and $".."; dash reads a literal '$'.
        findings.append(Finding("$", "unsupported", "$'...' or $\"...\" quoting"))
    elif nxt == "{" and _SIMPLE_BRACED.match(command, i) is None:
        findings.append(
            Finding("$", "unsupported", "a ${...} expansion holding quotes, blanks or operators")
        )


def _double_quoted(
    command: str, i: int, buf: list[str], findings: list[Finding], flags: dict[str, bool]
) -> int:
    n = len(command)
    while i < n:
        run = _DQUOTED_RUN.match(command, i)
        if run is not None:
            buf.append(run.group())
            i = run.end()
            continue
        c = command[i]
        if c == '"':
            return i + 1
        if c == "\\" and command[i + 1 : i + 2] in ('"', "\\", "$", "`", "\n"):
            if command[i + 1] != "\n":
                buf.append(command[i + 1])
            i += 2
            continue
        if c == "`":
            findings.append(Finding("`", "substitution"))
            flags["dynamic"] = True
        elif c == "$":
            _dollar(command, i, findings)
            flags["dynamic"] = True
        buf.append(c)
        i += 1
    raise ShellSyntaxError("command has an unterminated double quote")


def _heredoc_word(
    command: str,
    i: int,
    strip_tabs: bool,
    heredocs: list[tuple[str, bool, bool]],
    findings: list[Finding],
) -> int:
    n = len(command)
    while i < n and command[i] in " \t":
        i += 1
    start = i
    while i < n and command[i] not in _DELIMITER_END:
        i += 1
    raw = command[start:i]
    if _DELIMITER.fullmatch(raw) is None:
        # Blanks inside quotes, partial quoting, escapes, expansions, an
        # empty word or bash's '<<<': shells disagree, or we would misread
        # where the body ends and skip checking commands after it.
        findings.append(
            Finding("<<", "unsupported", "a here-document delimiter that is not a plain word")
        )
    quoted = raw[:1] in ("'", '"')
    heredocs.append((raw.strip("'\""), quoted, strip_tabs))
    return start  # the delimiter is lexed again as an ordinary word


def _skip_heredocs(
    command: str, i: int, heredocs: list[tuple[str, bool, bool]], findings: list[Finding]
) -> int:
    n = len(command)
    for delimiter, quoted, strip_tabs in heredocs:
        while True:
            if i >= n:
                findings.append(
                    Finding("<<", "unsupported", "a here-document without its end line")
                )
                return n
            end = command.find("\n", i)
            end = n if end < 0 else end
            line = command[i:end]
            i = end + 1
            if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                break
            if not quoted:
                # An unquoted body still runs substitutions, and a trailing
                # backslash joins the next line (bash then matches the
                # delimiter across the join; dash does not).
                if "$(" in line or "`" in line:
                    findings.append(Finding("$(" if "$(" in line else "`", "substitution"))
                if line.endswith("\\"):
                    findings.append(
                        Finding("<<", "unsupported", "a here-document line ending in a backslash")
                    )
    return min(i, n)


def split_simple_commands(words: tuple[Word, ...]) -> list[list[Word]]:
    """Group words into simple commands, splitting at list and pipeline operators."""
    out: list[list[Word]] = [[]]
    for word in words:
        if word.op and word.text in SEPARATORS:
            out.append([])
        else:
            out[-1].append(word)
    return [c for c in out if c]
