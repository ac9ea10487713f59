"""Deciding whether a ``.git/config`` written inside the sandbox is safe to keep.

``git init``, ``git remote add`` and ``git config user.email`` all write
``.git/config``, so quarantining every sandbox-written config would make git
unusable inside the sandbox. Instead the file is parsed by the host's own
``git`` (the authoritative parser: a home-made INI reader that disagreed with
git on one quoting rule would let a key through) and kept only when every
key is on an allowlist of keys that make git neither run a program nor read
another file: no ``core.hooksPath``, ``core.fsmonitor``, ``core.pager``,
``core.sshCommand``, filters, diff drivers, aliases, ``include.path``,
credential helpers or ``extensions.worktreeConfig``. Without a ``git`` on
the host nothing is kept.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from typing import Final

__all__ = ["git_config_is_safe"]

_SYSTEM_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
_TIMEOUT_S: Final = 10.0
_MAX_BYTES: Final = 256 * 1024

_SAFE_KEYS: Final = re.compile(
    r"core\.(repositoryformatversion|filemode|bare|logallrefupdates|ignorecase"
    r"|precomposeunicode|symlinks|autocrlf|eol|safecrlf|quotepath|abbrev)"
    r"|(user|author|committer)\.(name|email)"
    r"|init\.defaultbranch|extensions\.objectformat"
    r"|branch\.[^\n]+\.(remote|merge)"
    r"|remote\.[^\n]+\.(url|pushurl|fetch)"
)
# A remote URL git would hand to a program of its choosing (ext::, a local
# path whose repository could be hostile, an option-looking host) is refused.
_SAFE_URL: Final = re.compile(r"(https?|ssh|git)://[^\s-][^\s]*|[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:\S+")


def _entries(listing: bytes) -> list[tuple[str, str]]:
    out = []
    for item in listing.split(b"\0"):
        if not item:
            continue
        key, _, value = item.decode("utf-8", "surrogateescape").partition("\n")
        out.append((key, value))
    return out


def _safe(key: str, value: str) -> bool:
    if _SAFE_KEYS.fullmatch(key) is None:
        return False
    if key.startswith("remote.") and key.rsplit(".", 1)[1] in ("url", "pushurl"):
        return _SAFE_URL.fullmatch(value) is not None
    return True


def git_config_is_safe(data: bytes, scratch_dir: str) -> bool:
    """Whether a git config file with contents ``data`` only sets allowlisted keys (blocking).

    Args:
        data: The file's bytes (read by the caller without following symlinks).
        scratch_dir: A private directory for the copy git parses.

    Returns:
        True when the host's git parses it and every key is allowlisted.
    """
    git = shutil.which("git", path=_SYSTEM_PATH)
    if git is None or len(data) > _MAX_BYTES:
        return False
    fd, copy = tempfile.mkstemp(prefix="gitconfig-", dir=scratch_dir)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        result = subprocess.run(
            [git, "config", "--file", copy, "--no-includes", "--null", "--list"],
            capture_output=True,
            env={"PATH": _SYSTEM_PATH, "GIT_CONFIG_NOSYSTEM": "1", "HOME": scratch_dir},
            stdin=subprocess.DEVNULL,
            timeout=_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        os.unlink(copy)
    if result.returncode != 0:
        return False
    return all(_safe(key, value) for key, value in _entries(result.stdout))
