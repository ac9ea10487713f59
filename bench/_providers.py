"""Opening benchmark sessions per provider; a provider that cannot open is a skip."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Final

import corral

from _harness import BenchSkip, skip_reason

PROVIDERS: Final = ("in-memory", "local-bash", "local-sandbox", "docker")
DOCKER_IMAGE: Final = "corral-test:latest"
SHELL_PROVIDERS: Final = ("local-bash", "local-sandbox", "docker")
SNAPSHOT_PROVIDERS: Final = ("in-memory", "local-bash", "local-sandbox")

_checked: dict[str, str | None] = {}


def precheck(kind: str) -> str | None:
    """Why ``kind`` cannot run on this machine, or None; cached per process."""
    if kind in _checked:
        return _checked[kind]
    reason: str | None = None
    if kind == "local-sandbox":
        if not sys.platform.startswith("linux"):
            reason = "bench runs local-sandbox on Linux (bwrap) only"
        elif shutil.which("bwrap") is None:
            reason = "bwrap is not installed"
    elif kind == "docker":
        if shutil.which("docker") is None:
            reason = "docker CLI is not installed"
        else:
            proc = subprocess.run(
                ["docker", "image", "inspect", "--format", "{{.Id}}", DOCKER_IMAGE],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            if proc.returncode != 0:
                err = proc.stderr.strip().splitlines()
                if err and "daemon" in err[0].lower():
                    reason = "no Docker daemon"
                else:
                    reason = f"image {DOCKER_IMAGE} missing (packages/docker/scripts/ci-setup.sh)"
    _checked[kind] = reason
    return reason


def provider_options(kind: str, tmp_root: Path) -> dict[str, Any]:
    """Provider factory options that keep the bench's files under ``tmp_root``."""
    if kind == "in-memory":
        return {"max_workspace_bytes": 4 * 1024**3, "max_snapshots": 1000}
    if kind == "docker":
        return {"image": DOCKER_IMAGE, "pull": False, "tmpdir_root": str(tmp_root)}
    return {"tmpdir_root": str(tmp_root)}


def capabilities_for(kind: str, wanted: tuple[str, ...]) -> dict[str, Any]:
    """The subset of ``wanted`` capabilities the provider has, with bench-friendly policies."""
    caps: dict[str, Any] = {}
    have = {"fs"} | ({"shell"} if kind in SHELL_PROVIDERS else set())
    have |= {"snapshot"} if kind in SNAPSHOT_PROVIDERS else set()
    for name in wanted:
        if name not in have:
            continue
        if name == "fs":
            caps[name] = {"max_file_size_mb": 64}
        elif name == "shell":
            caps[name] = {"allowed_commands": ["true", "cat", "echo", "ls"]}
        elif name == "snapshot":
            caps[name] = {"max_snapshots": 1000}
        else:
            caps[name] = True
    return caps


@asynccontextmanager
async def session(
    kind: str,
    tmp_root: Path,
    capabilities: tuple[str, ...] = ("fs",),
    *,
    lazy: bool = False,
    **open_kwargs: Any,
) -> AsyncIterator[corral.WorkspaceSession]:
    """An eagerly opened session, or :class:`BenchSkip` with the reason it cannot open."""
    reason = precheck(kind)
    if reason is not None:
        raise BenchSkip(reason)
    caps = capabilities_for(kind, capabilities)
    missing = set(capabilities) - set(caps)
    if missing:
        raise BenchSkip(f"{kind} has no {', '.join(sorted(missing))}")
    async with AsyncExitStack() as stack:
        try:
            ses = await stack.enter_async_context(
                corral.open_workspace(
                    kind,
                    caps,
                    provider_options=provider_options(kind, tmp_root),
                    open_strategy="lazy" if lazy else "eager",
                    **open_kwargs,
                )
            )
        except (corral.WorkspaceError, OSError) as exc:
            raise BenchSkip(f"{kind} failed to open: {skip_reason(exc)}") from exc
        yield ses


def host_dir(ses: corral.WorkspaceSession) -> Path | None:
    """The host directory behind a tmpdir-backed workspace (local-bash, sandbox, docker)."""
    ref = ses.ref
    if ref is None:
        return None
    payload: Mapping[str, Any] = ref.payload
    base, name = payload.get("base_dir"), payload.get("workspace")
    if not base or not name:
        return None
    path = Path(base) / name
    return path if path.is_dir() else None


def ok(result: corral.ToolResult) -> corral.ToolResult:
    """The result, or :class:`BenchSkip` naming the tool error (a broken row, not a crash)."""
    if result.is_error:
        raise BenchSkip(f"tool error ({result.error_code}): {result.content[:120]}")
    return result
