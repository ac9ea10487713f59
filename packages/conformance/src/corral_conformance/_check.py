"""Running the shipped suite programmatically: ``check_provider`` and ``check_kind``."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

import corral
from corral import WorkspaceRef
from corral.provider import Workspace, WorkspaceProvider

from ._harness import DEFAULT_MAX_EXAMPLES, _same_ref
from ._report import ConformanceReport, ResultCollector
from ._target import TARGET_KEY, Target, host_dir_from_details

__all__ = ["SUITE_PATH", "check_kind", "check_provider", "run_suite"]

SUITE_PATH = Path(__file__).with_name("_shipped_suite.py")
"""The shipped suite module, collected explicitly by every runner."""


class _TargetPlugin:
    def __init__(self, target: Target) -> None:
        self._target = target

    def pytest_configure(self, config: pytest.Config) -> None:
        config.stash[TARGET_KEY] = self._target


def run_suite(
    target: Target | None,
    *,
    provider_id: str,
    args: Sequence[str] = (),
    rules: Iterable[str] | None = None,
    max_examples: int = DEFAULT_MAX_EXAMPLES,
    shrink: bool = True,
    verbose: bool = False,
) -> ConformanceReport:
    """Run the shipped suite in this process and collect per-rule results.

    Args:
        target: The provider to run against (None: ``args`` select one with
            ``--corral-provider``).
        provider_id: Name shown in the report.
        args: Extra pytest arguments.
        rules: Only these rules (test names without ``test_``).
        max_examples: Hypothesis budget per property.
        shrink: Shrink failing hypothesis examples (slower, clearer reports).
        verbose: Let pytest print progress and tracebacks.
    """
    collector = ResultCollector(rules)
    plugins: list[object] = [collector]
    if target is not None:
        plugins.append(_TargetPlugin(target))
    with tempfile.TemporaryDirectory(prefix="corral-conformance-") as tmp:
        # An empty ini of our own: the caller's addopts, filterwarnings and
        # conftest files must not change what the suite means.
        ini = Path(tmp, "pytest.ini")
        ini.write_text("[pytest]\n", encoding="utf-8")
        argv = [
            str(SUITE_PATH),
            "-c",
            str(ini),
            "--rootdir",
            tmp,
            "--noconftest",
            "-p",
            "no:cacheprovider",
            "-p",
            "anyio",
            # The suite's async rules run on anyio's plugin; pytest-asyncio, where
            # installed, would claim them too (and warns at start-up).
            "-p",
            "no:asyncio",
            f"--corral-max-examples={max_examples}",
            *([] if shrink else ["--corral-no-shrink"]),
            *(["-v", "--tb=short"] if verbose else ["-p", "no:terminal", "-p", "no:warnings"]),
            *args,
        ]
        exit_code = pytest.main(argv, plugins=plugins)
    return collector.report(provider_id, int(exit_code))


def check_provider(
    factory: Callable[[], WorkspaceProvider],
    *,
    provider_options: Mapping[str, Any] | None = None,
    host_dir: Callable[[Workspace], Path | None] | None = None,
    downgrade_ref: Callable[[WorkspaceRef], WorkspaceRef] | None = None,
    data_paths: Callable[[Workspace], Sequence[Path]] | None = None,
    rules: Iterable[str] | None = None,
    max_examples: int = DEFAULT_MAX_EXAMPLES,
    backends: Sequence[str] = ("asyncio",),
    shrink: bool = True,
    verbose: bool = False,
) -> ConformanceReport:
    """Run the conformance suite against a provider, without writing any test.

    Like trio's ``check_one_way_stream``: call it from a script, a notebook
    or a plain test. It runs pytest in this process, so call it from
    synchronous code (not inside a running event loop).

    Args:
        factory: Builds a fresh provider; called once per rule.
        provider_options: ``ProviderConfig.options`` for every open.
        host_dir: Maps a workspace to its directory on this host, enabling the
            canary and symlink rules (default: ``details()["host_dir"]``...).
        downgrade_ref: Makes a valid N-1 ref from a current one (default:
            restamp the version).
        data_paths: Maps a workspace to the host paths holding its data,
            checked gone after close (default: its host directory).
        rules: Only these tests: names without ``test_``, rule ids or rule-id
            prefixes (``refs``, ``refs.version``).
        max_examples: Hypothesis budget per property.
        backends: anyio backends to run on (``asyncio``, ``trio``).
        shrink: Shrink failing hypothesis examples (slower, clearer reports).
        verbose: Let pytest print progress and tracebacks.

    Returns:
        The per-rule report; ``report.ok`` tells whether the provider passed.
    """
    target = Target(
        factory=factory,
        options=dict(provider_options or {}),
        host_dir=host_dir or host_dir_from_details,
        downgrade_ref=downgrade_ref or _same_ref,
        backends=tuple(backends),
        data_paths=data_paths,
    )
    provider_id = factory().provider_id
    return run_suite(
        target,
        provider_id=provider_id,
        rules=rules,
        max_examples=max_examples,
        shrink=shrink,
        verbose=verbose,
    )


def check_kind(
    kind: str,
    *,
    factory_options: Mapping[str, Any] | None = None,
    rules: Iterable[str] | None = None,
    max_examples: int = DEFAULT_MAX_EXAMPLES,
    backends: Sequence[str] = ("asyncio",),
    shrink: bool = True,
    verbose: bool = False,
) -> ConformanceReport:
    """Run the suite against an installed provider plugin, found by its kind.

    Args:
        kind: The provider kind (``ProviderSpec.kind``).
        factory_options: Keyword options for the provider's factory.
        rules: Only these tests: names without ``test_``, rule ids or rule-id
            prefixes (``refs``, ``refs.version``).
        max_examples: Hypothesis budget per property.
        backends: anyio backends to run on (``asyncio``, ``trio``).
        shrink: Shrink failing hypothesis examples (slower, clearer reports).
        verbose: Let pytest print progress and tracebacks.

    Raises:
        corral.ConfigError: No installed plugin provides ``kind``, or its
            factory refuses ``factory_options``.
    """
    spec = corral.load_plugins().provider(kind)
    options = dict(factory_options or {})
    spec.create(options)  # fail here, with ConfigError, rather than once per rule
    target = Target(
        factory=lambda: spec.create(options),
        spec_capabilities=frozenset(spec.capabilities),
        backends=tuple(backends),
        kind=kind,
        factory_options=options,
    )
    return run_suite(
        target,
        provider_id=kind,
        rules=rules,
        max_examples=max_examples,
        shrink=shrink,
        verbose=verbose,
    )
