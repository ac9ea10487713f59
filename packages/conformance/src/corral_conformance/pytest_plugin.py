"""The pytest plugin: ``pytest --corral-provider=KIND`` runs the suite against a provider.

Installed through the ``pytest11`` entry point, so it is present in every
pytest run of an environment with corral-conformance. Without
``--corral-provider`` it only adds its command-line options: no fixtures,
no collection changes, no warnings.
"""

from __future__ import annotations

import json

import pytest

import corral

from ._check import SUITE_PATH
from ._harness import DEFAULT_MAX_EXAMPLES
from ._rules import MARKER
from ._target import TARGET_KEY, Target

__all__ = ["pytest_addoption", "pytest_configure"]


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``--corral-*`` options."""
    group = parser.getgroup("corral-conformance", "corral provider conformance suite")
    group.addoption(
        "--corral-provider",
        metavar="KIND",
        default=None,
        help="run the corral conformance suite against the installed provider KIND",
    )
    group.addoption(
        "--corral-provider-options",
        metavar="JSON",
        default=None,
        help="JSON object of keyword options for the provider's factory",
    )
    group.addoption(
        "--corral-max-examples",
        metavar="N",
        type=int,
        default=DEFAULT_MAX_EXAMPLES,
        help=f"hypothesis examples per conformance property (default {DEFAULT_MAX_EXAMPLES})",
    )
    group.addoption(
        "--corral-no-shrink",
        action="store_true",
        default=False,
        help="report the first failing hypothesis example without shrinking it (faster)",
    )
    group.addoption(
        "--corral-backends",
        metavar="NAMES",
        default="asyncio",
        help="comma-separated anyio backends for the conformance suite (default asyncio)",
    )


def _factory_options(config: pytest.Config) -> dict[str, object]:
    raw = config.getoption("corral_provider_options")
    if raw is None:
        return {}
    try:
        options = json.loads(raw)
    except ValueError:
        raise pytest.UsageError("--corral-provider-options is not valid JSON") from None
    if not isinstance(options, dict):
        raise pytest.UsageError("--corral-provider-options must be a JSON object")
    return options


def pytest_configure(config: pytest.Config) -> None:
    """Register the rule marker; with ``--corral-provider``, select the provider and suite."""
    config.addinivalue_line(
        "markers", f"{MARKER}(*ids): the corral contract rules a conformance test checks"
    )
    kind = config.getoption("corral_provider", None)
    backends = tuple(
        b.strip()
        for b in str(config.getoption("corral_backends", "asyncio")).split(",")
        if b.strip()
    )
    if not kind:
        return
    options = _factory_options(config)
    try:
        spec = corral.load_plugins().provider(kind)
        spec.create(options)
    except corral.ConfigError as exc:
        raise pytest.UsageError(f"--corral-provider={kind}: {exc}") from None
    config.stash[TARGET_KEY] = Target(
        factory=lambda: spec.create(options),
        spec_capabilities=frozenset(spec.capabilities),
        backends=backends,
        kind=kind,
        factory_options=options,
    )
    suite = str(SUITE_PATH)
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        if suite not in config.args:
            config.args.append(suite)
    else:
        # No paths on the command line: run just the suite, not the testpaths.
        config.args[:] = [suite]
