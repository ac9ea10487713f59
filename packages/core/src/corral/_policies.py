"""Policies of the built-in capabilities: what ``True`` or a dict in the config becomes.

Config values arrive as JSON (a CLI flag, an MCP host's config file, a dict in
code), so every option is checked strictly for its type: a string where a
list is expected is an error naming the key, never iterated as characters; a
boolean is not a number; a number is not a boolean.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

__all__ = [
    "CodePolicy",
    "FsPolicy",
    "OptionTypeError",
    "ProcessPolicy",
    "ScriptPolicy",
    "ShellPolicy",
    "SnapshotPolicy",
    "structure_option",
]


class OptionTypeError(TypeError):
    """A config value does not have the type its option declares.

    Args:
        expected: What the option takes, in words (``a list of strings``).
    """

    def __init__(self, expected: str) -> None:
        super().__init__(f"expected {expected}")
        self.expected = expected


_UNKNOWN: Any = object()


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check(value: object, tp: Any) -> tuple[object, str]:
    """``(value to pass, expected words)``; the value is ``_UNKNOWN`` on a mismatch.

    Raises ``LookupError`` for a type hint this checker does not understand.
    """
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any or tp is object:
        return value, "any value"
    if origin in (typing.Union, types.UnionType):
        arms: list[str] = []
        for arm in args:
            got, expected = _check(value, arm)
            if got is not _UNKNOWN:
                return got, expected
            arms.append(expected)
        return _UNKNOWN, " or ".join(arms)
    if tp is type(None):
        return (None if value is None else _UNKNOWN), "null"
    if origin is Literal:
        ok = any(type(value) is type(a) and value == a for a in args)
        return (value if ok else _UNKNOWN), "one of " + ", ".join(repr(a) for a in args)
    if tp is bool:
        return (value if isinstance(value, bool) else _UNKNOWN), "true or false"
    if tp is int:
        return (value if isinstance(value, int) and not isinstance(value, bool) else _UNKNOWN), (
            "an integer"
        )
    if tp is float:
        ok = _is_number(value) and math.isfinite(value)  # type: ignore[arg-type]
        return (float(value) if ok else _UNKNOWN), "a finite number"  # type: ignore[arg-type]
    if tp is str:
        return (value if isinstance(value, str) else _UNKNOWN), "a string"
    if origin in (tuple, list, Sequence) or tp in (tuple, list):
        item = args[0] if args else Any
        words = f"a list of {_plural(item)}"
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            raise LookupError(tp)  # a fixed-length tuple is not a JSON shape
        if not isinstance(value, list | tuple):
            return _UNKNOWN, words
        out = []
        for element in value:
            got, _ = _check(element, item)
            if got is _UNKNOWN:
                return _UNKNOWN, words
            out.append(got)
        return (tuple(out) if origin is not list else out), words
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        key_t, val_t = args if args else (Any, Any)
        words = f"an object mapping {_plural(key_t)} to {_plural(val_t)}"
        if not isinstance(value, Mapping):
            return _UNKNOWN, words
        result: dict[object, object] = {}
        for k, v in value.items():
            gk, _ = _check(k, key_t)
            gv, _ = _check(v, val_t)
            if gk is _UNKNOWN or gv is _UNKNOWN:
                return _UNKNOWN, words
            result[gk] = gv
        return result, words
    raise LookupError(tp)


def _plural(tp: Any) -> str:
    names = {str: "strings", int: "integers", float: "numbers", bool: "booleans"}
    return names.get(tp, "values")


def structure_option(
    value: object, tp: Any, *, fallback: Callable[[object, Any], object] | None = None
) -> object:
    """Check one config value strictly against its option's type hint.

    Understands the JSON-shaped hints policies use (``bool``, ``int``,
    ``float``, ``str``, ``Literal``, ``X | None``, ``tuple[X, ...]``,
    ``list``, ``Mapping``/``dict``); a string is never a list, a boolean is
    never a number, a number is never a boolean.

    Args:
        value: The raw config value.
        tp: The option's (resolved) type hint.
        fallback: Structures hints this function does not understand (a
            third-party policy's own classes); without it they raise.

    Returns:
        The value to pass to the policy class (lists become tuples where the
        hint is a tuple).

    Raises:
        OptionTypeError: The value does not fit; ``expected`` says what would.
    """
    try:
        got, expected = _check(value, tp)
    except LookupError:
        if fallback is None:
            raise OptionTypeError(_hint_name(tp)) from None
        return fallback(value, tp)
    if got is _UNKNOWN:
        raise OptionTypeError(expected)
    return got


def _hint_name(tp: object) -> str:
    text = getattr(tp, "__name__", None) or str(tp)
    return text.replace("typing.", "").replace("collections.abc.", "")


# -- validators for direct construction (ShellPolicy(allowed_commands="ls")) ----------


def _positive(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if not _is_number(value) or not math.isfinite(value) or not value > 0:  # type: ignore[arg-type,operator]
        raise ValueError(f"{attr.name} must be a number greater than 0")


def _count(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{attr.name} must be an integer greater than 0")


def _flag(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{attr.name} must be true or false")


def _name_list(value: Iterable[str] | None, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        # "ls" must not become ("l", "s").
        raise TypeError(f"{what} must be a list of names")
    names = tuple(value)
    for name in names:
        if not isinstance(name, str) or not name or name != name.strip():
            raise ValueError(f"{what} must hold non-empty names without surrounding spaces")
    return names


def _allowed_commands(value: Iterable[str] | None) -> tuple[str, ...] | None:
    return _name_list(value, "allowed_commands")


def _languages(value: Iterable[str]) -> tuple[str, ...]:
    names = _name_list(value, "languages")
    if names is None:
        raise TypeError("languages must be a list of names")
    return names


def _str_map(value: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise TypeError("env must map strings to strings")
    return dict(value)


@attrs.frozen(kw_only=True)
class FsPolicy:
    """``capabilities.fs``.

    Attributes:
        max_file_size_mb: Largest file read_file returns or write_file accepts.
        read_only: Only the read tools (read_file, ls, glob, grep, stat) are offered.
    """

    max_file_size_mb: float = attrs.field(default=10.0, validator=_positive)
    read_only: bool = attrs.field(default=False, validator=_flag)

    @property
    def max_file_bytes(self) -> int:
        """The size cap in bytes."""
        return int(self.max_file_size_mb * 1024 * 1024)


@attrs.frozen(kw_only=True)
class ShellPolicy:
    """``capabilities.shell``.

    Attributes:
        allowed_commands: Program names the model may run (None: any program).
        allow_shell_syntax: Pipes, redirections, globs, ``$VAR`` and ``;`` run
            through ``sh -c``. Its default is the provider's
            (``ProviderSpec.policy_defaults``): on where a kernel boundary
            contains every command (local-sandbox, docker), off otherwise
            (local-bash, where the guard is the only line).
        timeout_s: Default and maximum timeout of one command.
        max_output_bytes: Cap on each of stdout and stderr.
        env: Extra environment variables every command gets.
    """

    allowed_commands: tuple[str, ...] | None = attrs.field(
        default=None, converter=_allowed_commands
    )
    allow_shell_syntax: bool = attrs.field(default=False, validator=_flag)
    timeout_s: float = attrs.field(default=30.0, validator=_positive)
    max_output_bytes: int = attrs.field(default=1_000_000, validator=_count)
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_str_map)


@attrs.frozen(kw_only=True)
class CodePolicy:
    """``capabilities.code``.

    Attributes:
        languages: Languages the model may run.
        is_stateful: Also offer the code-context tools.
        timeout_s: Timeout of one run.
    """

    languages: tuple[str, ...] = attrs.field(default=("python",), converter=_languages)
    is_stateful: bool = attrs.field(default=False, validator=_flag)
    timeout_s: float = attrs.field(default=30.0, validator=_positive)


@attrs.frozen(kw_only=True)
class ScriptPolicy:
    """``capabilities.script``.

    Attributes:
        network: ``off``, or ``on`` to give scripts the network: then
            ``workspace_script`` runs only on a runner whose ``has_network``
            is True, and refuses (``unsupported``) on the offline boxes of
            the built-in providers.
        max_duration_ms: Wall-clock cap of one script.
    """

    network: Literal["off", "on"] = attrs.field(
        default="off", validator=attrs.validators.in_(("off", "on"))
    )
    max_duration_ms: int = attrs.field(default=5000, validator=_count)


@attrs.frozen(kw_only=True)
class SnapshotPolicy:
    """``capabilities.snapshot``.

    Attributes:
        max_snapshots: How many snapshots a workspace may hold at once.
    """

    max_snapshots: int = attrs.field(default=50, validator=_count)


@attrs.frozen(kw_only=True)
class ProcessPolicy:
    """``capabilities.process``: background processes and terminals the model drives.

    A process outlives the tool call that started it, so its limits are
    per workspace (how many run at once) and per stream (how much output is
    kept), not only per call.

    Attributes:
        allowed_commands: Program names the model may start (None: any).
            A terminal's shell runs whatever is typed into it: allow a shell
            here (or ``terminal``) only when that is acceptable.
        allow_shell_syntax: As for ``shell``; the provider's default applies
            (``ProviderSpec.policy_defaults``) when the config does not say.
        max_processes: Processes that may run at once in one workspace
            (terminals included); ended ones do not count.
        retained_bytes: Bytes of each output stream kept for readers (at
            most this many, at least the most recent half); older output
            expires (a read from before it is ``cursor_expired``).
        timeout_s: Default lifetime of a process: it is killed, with its
            whole tree, after this many seconds.
        max_timeout_s: The longest lifetime the model may ask for.
        max_wait_s: The longest a read may wait for new output.
        max_read_bytes: Largest read (and default read size) of one call (at least 4).
        terminal: Offer the terminal tools (a pseudo-terminal the model
            types into and whose rendered screen it reads).
        env: Extra environment variables every process gets.
    """

    allowed_commands: tuple[str, ...] | None = attrs.field(
        default=None, converter=_allowed_commands
    )
    allow_shell_syntax: bool = attrs.field(default=False, validator=_flag)
    max_processes: int = attrs.field(default=8, validator=_count)
    retained_bytes: int = attrs.field(default=8 << 20, validator=_count)
    timeout_s: float = attrs.field(default=3600.0, validator=_positive)
    max_timeout_s: float = attrs.field(default=86400.0, validator=_positive)
    max_wait_s: float = attrs.field(default=30.0, validator=_positive)
    max_read_bytes: int = attrs.field(default=65536, validator=_count)
    terminal: bool = attrs.field(default=True, validator=_flag)
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_str_map)

    def __attrs_post_init__(self) -> None:
        if self.timeout_s > self.max_timeout_s:
            raise ValueError("timeout_s must not exceed max_timeout_s")
        if self.max_read_bytes < 4:
            # A read must be able to carry one whole UTF-8 character (see _process_tools).
            raise ValueError("max_read_bytes must be at least 4")
