"""The file tools honour the protected paths too, by identity rather than spelling.

The file tools run on the host, outside the sandbox: without this check a
model could plant ``.git/hooks/pre-commit`` with ``write_file`` instead of
``echo``. A spelling check alone is not enough: after ``ln -s . alias`` the
path ``alias/.bashrc`` names the protected ``.bashrc``. So every mutating
call resolves the deepest existing directory of its target beneath the root
exactly as the filesystem will (symlinks inside the workspace followed), asks
the kernel for that directory's canonical path, and checks the canonical
workspace-relative target as well as the spelling. After a write, edit or
mkdir the protected-path checker runs once more, which catches what no
pre-check can (a leaf symlink the filesystem follows, a directory swapped by
a command running meanwhile). The ``.git*`` paths are refused below any
directory too (``sub/.git/config``): ``git status`` at the root obeys a
nested repository's config. Reads, listings and searches cost nothing extra.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import anyio.to_thread

from corral.provider import FileSystem, ForwardingFileSystem, OperationError, path_parts
from corral_posix import Resolver, open_beneath

from ._policy import ProtectedPath
from ._protect import ProtectedPathChecker

__all__ = ["ProtectedFileSystem"]

_ROOT_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_REASON = "(VCS hooks/config, shell start-up, editor and agent configuration)"


def _denied(verb: str, prot: tuple[str, ...]) -> OperationError:
    # Names the policy's protected path, never the caller's spelling of it.
    return OperationError(
        f"cannot {verb} there: it is, or lies under, the protected path /{'/'.join(prot)} "
        + _REASON,
        code="policy_denied",
    )


class ProtectedFileSystem(ForwardingFileSystem):
    """A FileSystem that refuses writes to, under, or removal of protected paths.

    Comparison is case-insensitive, so ``.GIT/hooks`` on a case-insensitive
    host filesystem is refused as well.

    Args:
        inner: The workspace's filesystem.
        protected: The protected paths.
        root: Host path of the workspace (re-opened per call, so a restore
            that swapped the directory is followed); None checks spelling only.
        checker: The workspace's protected-path checker, run after every
            write, edit and mkdir.
        resolver: The resolver ``inner`` uses (see :func:`corral_posix.open_beneath`);
            ``walk`` is honoured, anything else means ``auto``.
    """

    def __init__(
        self,
        inner: FileSystem,
        protected: Sequence[ProtectedPath],
        *,
        root: str | None = None,
        checker: ProtectedPathChecker | None = None,
        resolver: str = "auto",
    ) -> None:
        super().__init__(inner)
        self._protected = [tuple(p.path.casefold().split("/")) for p in protected]
        # A nested repository's own ``.git*`` entries (see ``_protect.py``).
        self._nested = [p for p in self._protected if p[0].startswith(".git")]
        self._root = root
        self._checker = checker
        self._resolver: Resolver = "walk" if resolver == "walk" else "auto"

    # -- checks ------------------------------------------------------------------

    def _match(self, parts: Sequence[str], verb: str, *, holding: bool) -> None:
        folded = tuple(p.casefold() for p in parts)
        for prot in self._protected:
            if folded[: len(prot)] == prot or (holding and prot[: len(folded)] == folded):
                raise _denied(verb, prot)
        for i in range(1, len(folded)):
            for prot in self._nested:
                if folded[i : i + len(prot)] == prot:
                    raise _denied(verb, prot)

    def _canonical(
        self, root_fd: int, root_real: str, parts: Sequence[str], *, whole: bool = False
    ) -> tuple[str, ...]:
        """``parts`` with its deepest resolvable prefix replaced by the kernel's canonical path.

        ``whole`` tries only the complete path (its leaf symlink followed).
        """
        for k in range(len(parts), len(parts) - 1 if whole else -1, -1):
            try:
                fd = open_beneath(
                    root_fd, parts[:k], os.O_PATH, resolver=self._resolver, follow_leaf=True
                )
            except OperationError:
                continue
            try:
                real = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                return tuple(parts)
            finally:
                os.close(fd)
            if real == root_real:
                return tuple(parts[k:])
            if real.startswith(root_real.rstrip("/") + "/"):
                return tuple(real[len(root_real.rstrip("/")) + 1 :].split("/")) + tuple(parts[k:])
            return tuple(parts)  # deleted meanwhile, or no /proc: spelling only
        return tuple(parts)

    def _check_sync(
        self, parts: tuple[str, ...], verb: str, *, follow_leaf: bool, holding: bool
    ) -> None:
        self._match(parts, verb, holding=holding)
        if self._root is None or not parts:
            return
        try:
            root_fd = os.open(self._root, _ROOT_FLAGS)
        except OSError:
            return  # the inner filesystem reports the lost workspace
        try:
            try:
                root_real = os.readlink(f"/proc/self/fd/{root_fd}")
            except OSError:
                return
            # The leaf itself is followed only where the filesystem follows it.
            targets = [self._canonical(root_fd, root_real, parts[:-1]) + parts[-1:]]
            if follow_leaf:
                targets.append(self._canonical(root_fd, root_real, parts, whole=True))
            for target in targets:
                self._match(target, verb, holding=holding)
        finally:
            os.close(root_fd)

    async def _check(
        self, path: str, verb: str, *, follow_leaf: bool = False, holding: bool = False
    ) -> None:
        parts = tuple(path_parts(path))
        self._match(parts, verb, holding=holding)  # the cheap refusal first, no thread
        if self._root is not None and parts:
            await anyio.to_thread.run_sync(
                lambda: self._check_sync(parts, verb, follow_leaf=follow_leaf, holding=holding)
            )

    async def _after(self) -> None:
        if self._checker is None:
            return
        result = await self._checker.acheck()
        if result.notes or not result.clean:
            raise OperationError(
                f"the change reached a protected path {_REASON} and was moved out of the workspace",
                code="policy_denied",
            )

    # -- the calls that create, replace or remove a path ----------------------------

    async def write_file(self, path: str, data: bytes) -> None:
        """Write a file unless it is, or lies under, a protected path."""
        await self._check(path, "write", follow_leaf=True)
        await self._inner.write_file(path, data)
        await self._after()

    async def edit_file(
        self, path: str, old_text: str, new_text: str, *, replace_all: bool = False
    ) -> int:
        """Edit a file unless it is, or lies under, a protected path."""
        await self._check(path, "edit", follow_leaf=True)
        count = await self._inner.edit_file(path, old_text, new_text, replace_all=replace_all)
        await self._after()
        return count

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        """Create a directory unless it is, or lies under, a protected path."""
        await self._check(path, "create")
        await self._inner.mkdir(path, parents=parents)
        await self._after()

    async def rm(self, path: str, *, recursive: bool = False) -> None:
        """Remove unless the path is protected or (recursively) holds one."""
        if path_parts(path):  # the root: let the inner fs give the standard refusal
            await self._check(path, "remove", holding=recursive)
        await self._inner.rm(path, recursive=recursive)
