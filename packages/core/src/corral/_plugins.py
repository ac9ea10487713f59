"""Loading plugins: providers, capabilities and CLI commands from entry points."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import attrs
import pluggy

from . import hookspecs
from ._capabilities import AnyCapability
from ._data import names
from ._errors import ConfigError
from ._protocols import WorkspaceProvider

__all__ = [
    "BLOCK_ENV",
    "CliCommand",
    "PluginSet",
    "ProviderSpec",
    "load_plugins",
]

log = logging.getLogger("corral.plugins")

BLOCK_ENV: Final = "CORRAL_DISABLE_PLUGINS"
"""Comma-separated entry-point names that are not loaded (like tox's and pytest's -p no:)."""


@attrs.frozen
class ProviderSpec:
    """How to construct a provider, as a plugin registers it.

    Attributes:
        kind: The provider id users put in ``ProviderConfig.kind``.
        factory: Builds a provider from keyword options (``--corral-provider-options``,
            ``corral call --provider-options``, or ``open_workspace(provider_options=)``).
        capabilities: Capabilities the provider can populate.
        summary: One line for ``corral providers``.
        distribution: The distribution that ships it, for version display.
    """

    kind: str
    factory: Callable[..., WorkspaceProvider]
    capabilities: frozenset[str] = attrs.field(converter=names)
    summary: str = ""
    distribution: str | None = None

    @property
    def version(self) -> str | None:
        """Installed version of :attr:`distribution`, if known."""
        if self.distribution is None:
            return None
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def create(self, options: Mapping[str, Any] | None = None) -> WorkspaceProvider:
        """Build the provider; option errors become :class:`ConfigError`."""
        try:
            return self.factory(**dict(options or {}))
        except TypeError as exc:
            raise ConfigError(f"provider {self.kind}: bad options ({exc})") from None


@attrs.frozen
class CliCommand:
    """A ``corral`` subcommand contributed by a plugin.

    Attributes:
        name: Subcommand name.
        help: One line for ``corral --help``.
        configure: Adds arguments to the subcommand's parser.
        run: Runs the command; returns the exit status.
    """

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


@attrs.frozen
class PluginSet:
    """Everything the loaded plugins registered."""

    providers: Mapping[str, ProviderSpec]
    capabilities: Mapping[str, AnyCapability]
    commands: Mapping[str, CliCommand]
    manager: pluggy.PluginManager = attrs.field(eq=False, repr=False)
    failed: Mapping[str, str] = attrs.field(factory=dict)
    """Entry points that could not be imported: name -> one-line reason."""

    def provider(self, kind: str) -> ProviderSpec:
        """The spec of a provider kind.

        Raises:
            ConfigError: No installed plugin provides that kind.
        """
        try:
            return self.providers[kind]
        except KeyError:
            known = ", ".join(sorted(self.providers)) or "none"
            broken = "".join(
                f"; plugin {n!r} failed to load: {why}" for n, why in self.failed.items()
            )
            shown = kind if len(kind) <= 64 and kind.isprintable() else "?"
            raise ConfigError(
                f"unknown provider kind {shown!r} (installed: {known}); install its package, "
                f"e.g. pip install corral-local-bash{broken}"
            ) from None


def _collector(kind: str, into: dict[str, Any], key: Callable[[Any], str]) -> Callable[[Any], None]:
    def register(item: Any) -> None:
        name = key(item)
        if name in into:
            raise ConfigError(f"{kind} {name!r} is registered twice")
        into[name] = item

    return register


def load_plugins(
    extra_plugins: Iterable[object] = (),
    *,
    entrypoints: bool = True,
    blocked: Iterable[str] | None = None,
) -> PluginSet:
    """Build a plugin set: core built-ins, entry points, then ``extra_plugins``.

    Order (after tox): block names from ``CORRAL_DISABLE_PLUGINS`` (or
    ``blocked``), register core's built-ins, load the ``corral`` entry-point
    group, register ``extra_plugins``, then ``check_pending()`` so a
    misspelled ``corral_*`` hookimpl fails loudly.
    """
    from ._builtin_capabilities import BuiltinCapabilities

    pm = pluggy.PluginManager(hookspecs.NAME)
    pm.add_hookspecs(hookspecs)
    names = blocked if blocked is not None else os.environ.get(BLOCK_ENV, "").split(",")
    for name in names:
        if name.strip():
            pm.set_blocked(name.strip())
    pm.register(BuiltinCapabilities(), name="corral.builtin")
    failed: dict[str, str] = {}
    if entrypoints:
        failed = _load_entrypoints(pm)
    for plugin in extra_plugins:
        pm.register(plugin)
    pm.check_pending()

    providers: dict[str, ProviderSpec] = {}
    capabilities: dict[str, AnyCapability] = {}
    commands: dict[str, CliCommand] = {}
    pm.hook.corral_register_providers(register=_collector("provider", providers, lambda s: s.kind))
    pm.hook.corral_register_capabilities(
        register=_collector("capability", capabilities, lambda c: c.name)
    )
    pm.hook.corral_register_commands(register=_collector("command", commands, lambda c: c.name))
    return PluginSet(
        providers=providers,
        capabilities=capabilities,
        commands=commands,
        manager=pm,
        failed=failed,
    )


def _load_entrypoints(pm: pluggy.PluginManager) -> dict[str, str]:
    """Import the ``corral`` entry points; one that fails to import is recorded and skipped.

    A broken third-party wheel must not take every other provider (and the CLI)
    down with it. A plugin that imports but declares a misspelled hook still
    fails loudly in ``check_pending``.
    """
    failed: dict[str, str] = {}
    for ep in importlib.metadata.entry_points(group=hookspecs.NAME):
        if pm.is_blocked(ep.name) or pm.has_plugin(ep.name):
            continue
        try:
            plugin = ep.load()
        except Exception as exc:
            failed[ep.name] = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("corral plugin %r failed to load: %s", ep.name, failed[ep.name])
            continue
        pm.register(plugin, name=ep.name)
    return failed
