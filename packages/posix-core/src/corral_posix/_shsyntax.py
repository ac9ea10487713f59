"""A small POSIX shell lexer: enough to find shell syntax and simple commands.

It is not a shell parser.  It finds (1) every place a string uses shell
syntax (operators, expansions, globs, comments, tilde) and (2) the simple
commands of a list of pipelines, so an allowlist can be checked against each
program.  Constructs it does not understand are reported as findings and
refused by the guard rather than guessed at.
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
}


class ShellSyntaxError(ValueError):
    """The command cannot be lexed (an unterminated quote)."""


@attrs.frozen
class Finding:
    """One use of shell syntax: the character(s) and what they mean."""

    text: str
    kind: str  # "syntax", "glob" or "substitution"

    @property
    def description(self) -> str:
        """Human name of the construct, e.g. ``pipe``."""
        return _DESCRIPTIONS.get(self.text, "shell syntax")


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
                findings.append(Finding("\n", "syntax"))
                i += 2
                continue
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
            io = buf is not None and c in "<>" and not flags["quoted"] and "".join(buf).isdigit()
            finish(io_number=io)
            op = next(o for o in _OPERATORS if command.startswith(o, i))
            words.append(Word(op, op=True))
            findings.append(Finding(c, "syntax"))
            i += len(op)
            if op in ("<<", "<<-"):
                i = _heredoc_word(command, i, op == "<<-", heredocs)
        elif c == "$":
            sub = command[i + 1 : i + 2] == "("
            findings.append(Finding("$(" if sub else "$", "substitution" if sub else "syntax"))
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
    return Lexed(tuple(words), tuple(findings))


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
        if c in {"$", "`"}:
            sub = c == "`" or command[i + 1 : i + 2] == "("
            findings.append(
                Finding("$(" if c == "$" and sub else c, "substitution" if sub else "syntax")
            )
            flags["dynamic"] = True
        buf.append(c)
        i += 1
    raise ShellSyntaxError("command has an unterminated double quote")


def _heredoc_word(
    command: str, i: int, strip_tabs: bool, heredocs: list[tuple[str, bool, bool]]
) -> int:
    n = len(command)
    while i < n and command[i] in " \t":
        i += 1
    start = i
    while i < n and command[i] not in " \t\n" and command[i] not in _OPERATOR_CHARS:
        i += 1
    raw = command[start:i]
    quoted = any(q in raw for q in "'\"\\")
    heredocs.append((raw.replace("'", "").replace('"', "").replace("\\", ""), quoted, strip_tabs))
    return start  # the delimiter is lexed again as an ordinary word


def _skip_heredocs(
    command: str, i: int, heredocs: list[tuple[str, bool, bool]], findings: list[Finding]
) -> int:
    for delimiter, quoted, strip_tabs in heredocs:
        while i < len(command):
            end = command.find("\n", i)
            end = len(command) if end < 0 else end
            line = command[i:end]
            i = end + 1
            if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                break
            # An unquoted here-document still runs substitutions in its body.
            if not quoted and ("$(" in line or "`" in line):
                findings.append(Finding("$(" if "$(" in line else "`", "substitution"))
    return min(i, len(command))


def split_simple_commands(words: tuple[Word, ...]) -> list[list[Word]]:
    """Group words into simple commands, splitting at list and pipeline operators."""
    out: list[list[Word]] = [[]]
    for word in words:
        if word.op and word.text in SEPARATORS:
            out.append([])
        else:
            out[-1].append(word)
    return [c for c in out if c]
