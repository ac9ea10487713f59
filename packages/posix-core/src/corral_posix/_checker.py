"""CommandChecker: the command-policy checks every POSIX shell runs before launching."""

from __future__ import annotations

import logging
import os
import re
import shlex
from collections.abc import Mapping
from typing import Final

import attrs

from corral.provider import CommandRequest, OperationError, path_parts

from ._audit import AuditLog
from ._env import check_environment, denied_reason
from ._resolve import open_beneath
from ._shsyntax import REDIRECTIONS, Lexed, ShellSyntaxError, Word, lex, split_simple_commands

__all__ = [
    "MAX_COMMAND_BYTES",
    "RESERVED_WORDS",
    "UNSAFE_BUILTINS",
    "CheckedCommand",
    "CommandChecker",
    "allowlist_programs",
]

MAX_COMMAND_BYTES: Final = 64 * 1024
UNSAFE_BUILTINS: Final = frozenset(
    {
        "eval",
        "exec",
        "source",
        ".",
        "command",
        "builtin",
        "trap",
        "alias",
        "unalias",
        "hash",
        "enable",
        "fc",
        "type",
    }
)
"""Built-ins refused in shell-syntax mode when an allowlist is set: each can
run a program or code the allowlist never sees."""

RESERVED_WORDS: Final = frozenset(
    {
        "!",
        "{",
        "}",
        "[[",
        "]]",
        "case",
        "coproc",
        "do",
        "done",
        "elif",
        "else",
        "esac",
        "fi",
        "for",
        "function",
        "if",
        "in",
        "select",
        "then",
        "time",
        "until",
        "while",
    }
)
"""Reserved words of sh and bash, refused as a command name while an
allowlist is set even when listed: the lexer reads simple commands, not
compound ones, so it cannot tell which words such a construct runs."""

_DECLARATIONS: Final = frozenset({"export", "readonly", "local", "declare", "typeset"})
_ASSIGNMENT: Final = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?=)")

# Words of ASCII characters that neither sh, the lexer nor shlex give any
# meaning (no quotes, backslash, operators, '$', globs, '#', '~', and no
# whitespace but blanks), separated by blanks.  For such a command (not all
# blanks: refused earlier) ``str.split()`` is exactly ``shlex.split`` and the
# lexer finds nothing, so the full path would accept it with the same argv;
# anything else takes the full path.  A property test holds the two paths to
# identical decisions.
_PLAIN: Final = re.compile(r"[A-Za-z0-9_./:=+,@%\- \t]+")
# UTF-8 needs at most 4 bytes per code point: shorter commands skip the encode.
_MAX_CHARS_UNCHECKED: Final = MAX_COMMAND_BYTES // 4
_OPEN_DIR: Final = os.O_RDONLY | os.O_DIRECTORY


@attrs.frozen
class CheckedCommand:
    """What a shell may launch after every check passed.

    Attributes:
        argv: The program and arguments (``["sh", "-c", command]`` in
            shell-syntax mode).
        env: The caller's variables that passed the denylist (the shell adds
            its base environment underneath).
        cwd_parts: Working directory as components relative to the root.
        cwd_fd: The working directory opened beneath the root (when a root
            fd was given); the caller owns and closes it.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd_parts: tuple[str, ...]
    cwd_fd: int | None = None


class CommandChecker:
    """Allowlist, shell-syntax, environment and cwd checks, with an audit trail.

    Used host-side by every POSIX shell: :class:`SubprocessShell` (local-bash,
    local-sandbox) and shells that execute elsewhere (docker runs it, then
    execs into the container).  Refusals raise
    ``OperationError(code="policy_denied")`` with stable messages that name
    the rule; every decision is logged to ``<log_prefix>.audit``.

    Args:
        log_prefix: Logger name prefix; the audit logger is ``<prefix>.audit``.
        audit_logger: Use this logger instead.
        audit_max_per_minute: Rate limit of audit records; the number
            suppressed is logged with the next record that fits.
    """

    def __init__(
        self,
        *,
        log_prefix: str = "corral.shell",
        audit_logger: logging.Logger | None = None,
        audit_max_per_minute: int = 600,
    ) -> None:
        logger = audit_logger or logging.getLogger(f"{log_prefix}.audit")
        self.audit = AuditLog(logger, audit_max_per_minute)

    def check_request(
        self, request: CommandRequest, *, root_fd: int | None = None
    ) -> CheckedCommand:
        """Run every check on a request and record one audit decision.

        Args:
            request: The command and its policy.
            root_fd: Workspace root; when given, the cwd is also opened
                beneath it (see :meth:`open_cwd`) and returned as ``cwd_fd``.

        Raises:
            OperationError: ``policy_denied`` (allowlist, shell syntax,
                environment), ``invalid_argument`` (empty, NUL, oversized,
                unterminated quote, bad limits), ``invalid_path``,
                ``not_found`` or ``not_a_directory`` (cwd).
        """
        try:
            _check_limits(request)
            argv = self._command(request)
            env = check_environment(request.env, allow_path=request.allowed_commands is None)
            parts = self.cwd_parts(request.cwd)
            cwd_fd = None if root_fd is None else self.open_cwd(root_fd, request.cwd)
        except OperationError as exc:
            self.audit.rejected(_text(request.command), exc.message)
            raise
        try:
            self.audit.accepted(request.command, "/" + "/".join(parts), env)
        except BaseException:
            if cwd_fd is not None:
                os.close(cwd_fd)
            raise
        return CheckedCommand(tuple(argv), env, parts, cwd_fd)

    def check_command(self, request: CommandRequest) -> list[str]:
        """Check the command text against the policy in ``request``; audit it.

        Returns:
            The argv to run: ``shlex.split(command)`` or, in shell-syntax
            mode, ``["sh", "-c", command]``.

        Raises:
            OperationError: ``policy_denied`` or ``invalid_argument``.
        """
        try:
            argv = self._command(request)
        except OperationError as exc:
            self.audit.rejected(_text(request.command), exc.message)
            raise
        self.audit.accepted(request.command, request.cwd or "/", list(request.env))
        return argv

    def check_env(
        self, env: Mapping[str, str], *, allowlist_active: bool = False
    ) -> dict[str, str]:
        """Validate caller-supplied variables; a refusal is audited.

        Args:
            env: Variables the request asks for.
            allowlist_active: Also refuse ``PATH``, which would decide what a
                listed program name resolves to.

        Raises:
            OperationError: ``policy_denied`` naming the variable (never its value).
        """
        try:
            return check_environment(env, allow_path=not allowlist_active)
        except OperationError as exc:
            self.audit.rejected("", exc.message)
            raise

    @staticmethod
    def cwd_parts(cwd: str | None) -> tuple[str, ...]:
        """Agent-view cwd to components beneath the root (lexical check only).

        Raises:
            OperationError: ``invalid_path`` for ``..`` above the root, NUL, etc.
        """
        return () if cwd is None else path_parts(cwd)

    @staticmethod
    def relative_cwd(cwd: str | None) -> str:
        """Agent-view cwd as a relative path (``"."`` for the root), for shells
        that run elsewhere and join it under their own mount point."""
        parts = CommandChecker.cwd_parts(cwd)
        return "/".join(parts) or "."

    @staticmethod
    def open_cwd(root_fd: int, cwd: str | None) -> int:
        """Open the working directory beneath ``root_fd`` as an ``O_DIRECTORY`` fd.

        Symlinks are followed only while they stay beneath the root (openat2
        ``RESOLVE_BENEATH`` or a component walk); the caller starts the
        command in exactly this directory (``fchdir``), so nothing can swap
        it between the check and the use.

        Raises:
            OperationError: ``not_found``, ``not_a_directory`` or ``invalid_path``.
        """
        parts = CommandChecker.cwd_parts(cwd)
        if not parts:
            # "." beneath a directory fd cannot leave it nor cross a symlink:
            # plain openat is what both resolvers would do, minus ctypes.
            try:
                return os.open(".", _OPEN_DIR | os.O_CLOEXEC, dir_fd=root_fd)
            except OSError:
                pass  # open_beneath raises the same error, with its code and message
        return open_beneath(root_fd, parts, _OPEN_DIR, follow_leaf=True)

    def _command(self, request: CommandRequest) -> list[str]:
        command = request.command
        if not isinstance(command, str) or not command.strip():
            raise OperationError("command is empty", code="invalid_argument")
        if "\x00" in command:
            raise OperationError("command contains a NUL byte", code="invalid_argument")
        if (
            len(command) > _MAX_CHARS_UNCHECKED
            and len(command.encode("utf-8", "surrogatepass")) > MAX_COMMAND_BYTES
        ):
            raise OperationError(
                f"command is longer than {MAX_COMMAND_BYTES} bytes", code="invalid_argument"
            )
        allowed = request.allowed_commands
        if request.allow_shell_syntax:
            if allowed is not None:
                _check_shell_allowlist(command, allowed)
            # A leading '-' would be read as an option of sh; a space is inert.
            return ["sh", "-c", " " + command if command.startswith("-") else command]
        argv = _split_plain(command)
        if argv is None:
            argv = _split_argv(command)
        if allowed is not None:
            _check_program(argv[0], allowed)
        return argv


def _split_plain(command: str) -> list[str] | None:
    """The argv of a command without any shell syntax, or None (use the lexer)."""
    return command.split() if _PLAIN.fullmatch(command) else None


def _split_argv(command: str) -> list[str]:
    """Refuse shell syntax and split like ``sh`` would; the full argv-mode path."""
    if "\r" in command:
        # shlex splits on a carriage return, sh does not: refuse rather than guess.
        raise OperationError(
            "command contains a carriage return; send one line without CR",
            code="invalid_argument",
        )
    lexed = _lex(command)
    for finding in lexed.findings:
        if finding.kind == "glob":
            raise OperationError(
                f"command uses a glob ({finding.text!r}), which is not allowed without "
                "shell syntax; name the files explicitly",
                code="policy_denied",
            )
        raise OperationError(
            f"command uses shell syntax ({finding.text!r}, {finding.description}), which is "
            "not allowed; run a single program with arguments",
            code="policy_denied",
        )
    try:
        return shlex.split(command)
    except ValueError:
        raise OperationError(
            "command ends with a lone backslash", code="invalid_argument"
        ) from None


def _check_limits(request: CommandRequest) -> None:
    if not request.timeout_s > 0:
        raise OperationError("timeout_s must be greater than 0", code="invalid_argument")
    if request.max_output_bytes < 1:
        raise OperationError("max_output_bytes must be at least 1", code="invalid_argument")


def _lex(command: str) -> Lexed:
    try:
        return lex(command)
    except ShellSyntaxError as exc:
        raise OperationError(str(exc), code="invalid_argument") from None


def _check_program(program: str, allowed: frozenset[str]) -> None:
    """Match a program word against the allowlist by name; paths must match exactly."""
    if program in allowed:
        return
    if "/" in program and os.path.basename(program) in allowed:
        raise OperationError(
            f"command {program!r} names a path; run the allowed command "
            f"{os.path.basename(program)!r} by name instead",
            code="policy_denied",
        )
    raise OperationError(
        f"command {program!r} is not in the allowed commands", code="policy_denied"
    )


def _check_shell_allowlist(command: str, allowed: frozenset[str]) -> None:
    for program, args in allowlist_programs(command):
        _check_program_word(program, args, allowed)


def allowlist_programs(command: str) -> list[tuple[Word, list[Word]]]:
    """The command word and arguments of every simple command, as the guard reads them.

    Refuses what an allowlist cannot be checked against: command
    substitution, subshells, and constructs the lexer cannot read exactly as
    ``sh`` does (see :mod:`corral_posix._shsyntax`). Exposed so the
    differential test can compare this reading with what real shells run.

    Raises:
        OperationError: ``policy_denied`` for a refused construct or a denied
            assignment, ``invalid_argument`` for an unterminated quote.
    """
    lexed = _lex(command)
    for finding in lexed.findings:
        if finding.kind == "substitution":
            raise OperationError(
                f"command substitution ({finding.text!r}) is not allowed while an allowlist is set",
                code="policy_denied",
            )
        if finding.text in {"(", ")"}:
            raise OperationError(
                "subshells and function definitions ('(') are not allowed "
                "while an allowlist is set",
                code="policy_denied",
            )
        if finding.kind == "unsupported":
            raise OperationError(
                f"command uses {finding.description}, which cannot be checked against the "
                "allowed commands; rewrite it without that construct",
                code="policy_denied",
            )
    out: list[tuple[Word, list[Word]]] = []
    for simple in split_simple_commands(lexed.words):
        found = _program_of(simple)
        if found is not None:
            out.append(found)
    return out


def _check_assignment(word: Word) -> bool:
    """Refuse a denied variable or PATH; return whether ``word`` is an assignment."""
    match = _ASSIGNMENT.match(word.text)
    if match is None or word.op:
        return False
    name = match.group(1)
    reason = denied_reason(name)
    if reason is None and name.upper() == "PATH":
        reason = "PATH cannot be changed while an allowlist is set"
    if reason is not None:
        raise OperationError(
            f"environment variable {name!r} is not allowed ({reason})", code="policy_denied"
        )
    return True


def _program_of(words: list[Word]) -> tuple[Word, list[Word]] | None:
    """Split a simple command into its command word and arguments.

    Redirections and their targets are dropped; leading assignments are
    checked (a denied variable or PATH is refused) and dropped.
    """
    program: Word | None = None
    args: list[Word] = []
    skip_next = False
    for word in words:
        if skip_next:
            skip_next = False
            continue
        if word.op and word.text in REDIRECTIONS:
            skip_next = True
            continue
        if word.io_number:
            continue
        if program is None:
            if not word.quoted and _check_assignment(word):
                continue
            program = word
        else:
            args.append(word)
    return None if program is None else (program, args)


def _check_program_word(program: Word, args: list[Word], allowed: frozenset[str]) -> None:
    if program.dynamic or program.glob:
        raise OperationError(
            f"command name {program.text!r} must be a literal word while an allowlist is set",
            code="policy_denied",
        )
    if program.text in UNSAFE_BUILTINS:
        raise OperationError(
            f"built-in {program.text!r} is not allowed while an allowlist is set",
            code="policy_denied",
        )
    if program.text in RESERVED_WORDS and not program.quoted:
        raise OperationError(
            f"shell keyword {program.text!r} is not allowed while an allowlist is set; "
            "run simple commands joined by ';', '&&', '||' or '|'",
            code="policy_denied",
        )
    _check_program(program.text, allowed)
    if program.text in _DECLARATIONS:
        for arg in args:
            _check_assignment(arg)


def _text(command: object) -> str:
    return command if isinstance(command, str) else repr(command)
