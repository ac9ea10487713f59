"""The local-bash provider: a private host directory and a subprocess shell, no isolation."""

from __future__ import annotations

from typing import ClassVar

from corral_posix import TmpdirWorkspaceProvider

__all__ = ["LocalBashProvider"]


class LocalBashProvider(TmpdirWorkspaceProvider):
    """Workspaces in ``<tmpdir_root>/corral-local-bash-<uid>/``, commands run as this user.

    NOT a security boundary: commands run with the agent process's privileges
    and can read anything its user can, including the agent's environment
    through ``/proc/$PPID/environ``. Use it for trusted code only; for
    untrusted code use corral-local-sandbox or corral-docker.

    All keyword options are those of :class:`corral_posix.TmpdirWorkspaceProvider`
    (``tmpdir_root``, ``max_file_bytes``, ``allow_leaf_symlinks``, ``resolver``,
    ``shell_limits``, ``base_env``, ``snapshot_compresslevel``).
    """

    provider_id: ClassVar[str] = "local-bash"
