"""The environment denylist and the minimal environment commands start with."""

from __future__ import annotations

import functools
import os
import re
import tempfile
from collections.abc import Mapping
from typing import Final

from corral.provider import OperationError

__all__ = [
    "DEFAULT_PATH",
    "StartEnvironment",
    "base_environment",
    "check_environment",
    "denied_reason",
    "sanitize_path",
]

DEFAULT_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
MAX_ENV_BYTES: Final = 128 * 1024
_CACHED_NAME_CHARS: Final = 128

_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# Matched on the upper-cased name: the loader ignores ``Ld_Preload``, but a
# lower-case ``api_key`` is still a credential, and refusing a harmless
# odd-case name costs nothing.
_EXACT: Final[Mapping[str, str]] = {
    "BASH_ENV": "shell start-up variable",
    "ENV": "shell start-up variable",
    "PROMPT_COMMAND": "shell start-up variable",
    "SHELLOPTS": "shell start-up variable",
    "BASHOPTS": "shell start-up variable",
    "PS4": "shell start-up variable",
    "IFS": "shell start-up variable",
    "CDPATH": "shell start-up variable",
    "GLOBIGNORE": "shell start-up variable",
    "GLIBC_TUNABLES": "dynamic loader variable",
    "GCONV_PATH": "dynamic loader variable",
    "LOCPATH": "dynamic loader variable",
    "HOSTALIASES": "dynamic loader variable",
    "NODE_OPTIONS": "interpreter start-up variable",
    "NODE_PATH": "interpreter start-up variable",
    "PERL5OPT": "interpreter start-up variable",
    "PERL5LIB": "interpreter start-up variable",
    "PERLLIB": "interpreter start-up variable",
    "RUBYOPT": "interpreter start-up variable",
    "RUBYLIB": "interpreter start-up variable",
    "JAVA_TOOL_OPTIONS": "interpreter start-up variable",
    "_JAVA_OPTIONS": "interpreter start-up variable",
    "JDK_JAVA_OPTIONS": "interpreter start-up variable",
    "GPG_AGENT_INFO": "agent socket variable",
    "DOCKER_HOST": "credential-like variable",
    "KUBECONFIG": "credential-like variable",
}
_PREFIXES: Final = (
    ("LD_", "dynamic loader variable"),
    ("DYLD_", "dynamic loader variable"),
    ("MALLOC_", "dynamic loader variable"),
    ("PYTHON", "interpreter start-up variable"),
    ("BASH_FUNC_", "shell start-up variable"),
    ("GIT_", "git variable"),
    ("SSH_", "agent socket variable"),
)
_CREDENTIAL_WORDS: Final = (
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "AUTH",
    "COOKIE",
    "PRIVATE",
)


def denied_reason(name: str) -> str | None:
    """Why a variable name is refused (the rule's name), or None if allowed.

    Args:
        name: An environment variable name.

    Returns:
        A short rule name such as ``"dynamic loader variable"``, or None.
    """
    # Names are few and short in practice; a long one is not worth a cache slot.
    if len(name) <= _CACHED_NAME_CHARS:
        return _cached_reason(name)
    return _reason(name)


@functools.lru_cache(maxsize=1024)
def _cached_reason(name: str) -> str | None:
    return _reason(name)


def _reason(name: str) -> str | None:
    if not _NAME.match(name):
        return "not a valid variable name"
    upper = name.upper()
    if upper in _EXACT:
        return _EXACT[upper]
    for prefix, reason in _PREFIXES:
        if upper.startswith(prefix):
            return reason
    if any(word in upper for word in _CREDENTIAL_WORDS):
        return "credential-like variable"
    return None


def check_environment(env: Mapping[str, str], *, allow_path: bool = True) -> dict[str, str]:
    """Validate caller-supplied variables against the denylist.

    Raises:
        OperationError: ``policy_denied`` naming the first refused variable
            (its name only, never its value); ``invalid_argument`` for a
            non-string, a NUL byte or an oversized environment.
    """
    out: dict[str, str] = {}
    total = 0
    for name, value in env.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise OperationError(
                "environment names and values must be strings", code="invalid_argument"
            )
        shown = name if len(name) <= 64 else name[:64] + "..."
        reason = denied_reason(name)
        if reason is None and not allow_path and name.upper() == "PATH":
            reason = "PATH cannot be changed while an allowlist is set"
        if reason is not None:
            raise OperationError(
                f"environment variable {shown!r} is not allowed ({reason})", code="policy_denied"
            )
        if "\x00" in value:
            raise OperationError(
                f"environment variable {shown!r} contains a NUL byte", code="invalid_argument"
            )
        total += len(name.encode()) + len(value.encode("utf-8", "surrogatepass")) + 2
        if total > MAX_ENV_BYTES:
            raise OperationError(
                f"environment is larger than {MAX_ENV_BYTES} bytes", code="invalid_argument"
            )
        out[name] = value
    return out


def sanitize_path(path: str | None) -> str:
    """Keep only absolute ``PATH`` entries: an empty or relative entry would
    let a file the agent wrote in the working directory shadow a program."""
    entries = [e for e in (path or "").split(":") if e.startswith("/")]
    return ":".join(dict.fromkeys(entries)) or DEFAULT_PATH


def base_environment(root: str) -> dict[str, str]:
    """The environment every command starts from: nothing inherited but ``PATH``.

    Args:
        root: Host path of the workspace root (becomes ``HOME``).

    Returns:
        ``PATH`` (the host's, absolute entries only), ``HOME``, ``LANG`` and ``TMPDIR``.
    """
    return {
        "PATH": sanitize_path(os.environ.get("PATH")),
        "HOME": root,
        "LANG": "C.UTF-8",
        "TMPDIR": tempfile.gettempdir(),
    }


class StartEnvironment:
    """``base_environment(root)`` plus a module's ``base_env``, rebuilt only when its inputs change.

    A command's start is on the path to its first output: the host's
    ``PATH`` and the temp directory are looked up once, and again only
    when either changed (``os.environ`` or ``tempfile.tempdir``).

    Args:
        root: Host path of the workspace root.
        extra: Variables added over the base (the module's ``base_env``).
    """

    def __init__(self, root: str, extra: Mapping[str, str]) -> None:
        self._root = root
        self._extra = dict(extra)
        self._cached: tuple[tuple[str | None, str | None], dict[str, str]] | None = None

    def get(self) -> dict[str, str]:
        """The environment (shared: copy it before changing it)."""
        inputs = (os.environ.get("PATH"), tempfile.tempdir)
        cached = self._cached
        if cached is None or cached[0] != inputs:
            cached = (inputs, {**base_environment(self._root), **self._extra})
            self._cached = cached
        return cached[1]
