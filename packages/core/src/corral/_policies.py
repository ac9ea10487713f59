"""Policies of the built-in capabilities: what ``True`` or a dict in the config becomes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import attrs
from attrs import validators as v

__all__ = ["CodePolicy", "FsPolicy", "ScriptPolicy", "ShellPolicy", "SnapshotPolicy"]


def _positive(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attr.name} must be greater than 0")


def _names(value: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


@attrs.frozen(kw_only=True)
class FsPolicy:
    """``capabilities.fs``.

    Attributes:
        max_file_size_mb: Largest file read_file returns or write_file accepts.
        read_only: Only the read tools (read_file, ls, glob, grep, stat) are offered.
    """

    max_file_size_mb: float = attrs.field(default=10.0, validator=_positive)
    read_only: bool = False

    @property
    def max_file_bytes(self) -> int:
        """The size cap in bytes."""
        return int(self.max_file_size_mb * 1024 * 1024)


@attrs.frozen(kw_only=True)
class ShellPolicy:
    """``capabilities.shell``.

    Attributes:
        allowed_commands: Program names the model may run (None: any program).
        allow_shell_syntax: Pipes, redirections, globs and ``;`` run through ``sh -c``.
        timeout_s: Default and maximum timeout of one command.
        max_output_bytes: Cap on each of stdout and stderr.
        env: Extra environment variables every command gets.
    """

    allowed_commands: tuple[str, ...] | None = attrs.field(default=None, converter=_names)
    allow_shell_syntax: bool = False
    timeout_s: float = attrs.field(default=30.0, validator=_positive)
    max_output_bytes: int = attrs.field(default=1_000_000, validator=v.gt(0))
    env: Mapping[str, str] = attrs.field(factory=dict, converter=dict)


@attrs.frozen(kw_only=True)
class CodePolicy:
    """``capabilities.code``.

    Attributes:
        languages: Languages the model may run.
        is_stateful: Also offer the code-context tools.
        timeout_s: Timeout of one run.
    """

    languages: tuple[str, ...] = attrs.field(default=("python",), converter=tuple)
    is_stateful: bool = False
    timeout_s: float = attrs.field(default=30.0, validator=_positive)


@attrs.frozen(kw_only=True)
class ScriptPolicy:
    """``capabilities.script``.

    Attributes:
        network: ``off`` or ``on`` for the script runner.
        max_duration_ms: Wall-clock cap of one script.
    """

    network: Literal["off", "on"] = attrs.field(default="off", validator=v.in_(("off", "on")))
    max_duration_ms: int = attrs.field(default=5000, validator=v.gt(0))


@attrs.frozen(kw_only=True)
class SnapshotPolicy:
    """``capabilities.snapshot``.

    Attributes:
        max_snapshots: How many snapshots a workspace may hold at once.
    """

    max_snapshots: int = attrs.field(default=50, validator=v.gt(0))
