"""The entry point registers local-bash; the public surface is what __all__ says."""

from __future__ import annotations

from pathlib import Path

import corral
import corral_local_bash
from corral_local_bash import LocalBashProvider


def test_entry_point_registers_the_provider(root: Path) -> None:
    plugins = corral.load_plugins()
    spec = plugins.provider("local-bash")
    assert spec.factory is LocalBashProvider
    assert spec.capabilities == {"fs", "shell", "code", "process", "snapshot"}
    assert spec.distribution == "corral-local-bash"
    assert "no isolation" in spec.summary
    assert spec.version == "0.1.0"
    provider = spec.create({"tmpdir_root": str(root), "max_file_bytes": 1024})
    assert isinstance(provider, LocalBashProvider)
    assert provider.provider_id == "local-bash"
    assert provider.schema_version == 2
    assert provider.capabilities == spec.capabilities


def test_public_surface() -> None:
    assert corral_local_bash.__all__ == ["LocalBashProvider"]
    assert LocalBashProvider.__doc__
    assert "NOT a security boundary" in LocalBashProvider.__doc__
