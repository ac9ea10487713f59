"""Loading plugins: providers, capabilities and CLI commands from entry points."""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import attrs
import pluggy

from . import hookspecs
from ._capabilities import AnyCapability
from ._data import names
from ._echo import echo_if_short
from ._errors import ConfigError
from ._protocols import WorkspaceProvider

__all__ = [
    "BLOCK_ENV",
    "KNOWN_COMMANDS",
    "KNOWN_PROVIDERS",
    "CliCommand",
    "PluginSet",
    "ProviderSpec",
    "load_plugins",
]

log = logging.getLogger("corral.plugins")

BLOCK_ENV: Final = "CORRAL_DISABLE_PLUGINS"
"""Comma-separated entry-point names that are not loaded (like tox's and pytest's -p no:)."""

KNOWN_PROVIDERS: Final[Mapping[str, str]] = {
    "in-memory": "corral-memory",
    "local-bash": "corral-local-bash",
    "local-sandbox": "corral-local-sandbox",
    "docker": "corral-docker",
}
"""Provider kinds this project publishes -> the distribution that ships each.

An unknown kind is answered with the right ``pip install`` only when it is one
of these; for any other kind corral cannot know which wheel provides it.
"""

KNOWN_COMMANDS: Final[Mapping[str, str]] = {
    "mcp": "corral-mcp",
    "conformance": "corral-conformance",
}
"""CLI verbs this project's optional distributions add -> the distribution to install."""

Probe = Callable[[], "str | None"]
"""A cheap availability check: None when the provider can run here now, else why not."""


def _policy_defaults(value: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: dict(options) for name, options in value.items()}


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
        probe: Says cheaply (well under a second, no workspace created) whether
            the provider can run on this machine now: None when it can, else a
            one-line reason with advice ("bubblewrap is not installed: apt
            install bubblewrap"). ``corral providers`` shows it; None (no probe)
            means "assumed available".
        outlives_process: Its workspaces survive the process that opened them,
            so a stored ref can be resumed later (``corral call``). False for
            in-memory workspaces, which the CLI then never stores as resumable.
        policy_defaults: Per-capability option defaults that fit this
            provider's boundary, applied under the user's own options (e.g.
            ``{"shell": {"allow_shell_syntax": True}}`` where a kernel boundary
            contains every command). Empty means core's policy defaults.
    """

    kind: str
    factory: Callable[..., WorkspaceProvider]
    capabilities: frozenset[str] = attrs.field(converter=names)
    summary: str = ""
    distribution: str | None = None
    probe: Probe | None = attrs.field(default=None, kw_only=True, eq=False)
    outlives_process: bool = attrs.field(default=True, kw_only=True)
    policy_defaults: Mapping[str, Mapping[str, Any]] = attrs.field(
        factory=dict, kw_only=True, converter=_policy_defaults
    )

    @property
    def version(self) -> str | None:
        """Installed version of :attr:`distribution`, if known."""
        if self.distribution is None:
            return None
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def availability(self) -> str | None:
        """Run :attr:`probe`: None when the provider can run here now, else why not.

        A probe that raises counts as "not available" with the exception's
        type, so a broken probe never breaks ``corral providers``.
        """
        if self.probe is None:
            return None
        try:
            return self.probe()
        except Exception as exc:
            return f"availability probe failed ({type(exc).__name__})"

    def option_names(self) -> tuple[str, ...] | None:
        """The keyword options :attr:`factory` accepts, or None when it takes any."""
        try:
            params = inspect.signature(self.factory).parameters.values()
        except (TypeError, ValueError):
            return None
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return None
        return tuple(
            p.name
            for p in params
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        )

    def create(self, options: Mapping[str, Any] | None = None) -> WorkspaceProvider:
        """Build the provider from keyword options.

        Raises:
            ConfigError: ``options`` is not a mapping of names, names an option
                the factory does not take (the message lists the valid ones),
                or the factory refused a value.
        """
        if options is not None and not isinstance(options, Mapping):
            raise ConfigError(f"provider {self.kind}: options must be an object of names")
        opts = dict(options or {})
        valid = self.option_names()
        known = ", ".join(valid) if valid else "none"
        for key in opts:
            if not isinstance(key, str) or (valid is not None and key not in valid):
                raise ConfigError(
                    f"provider {self.kind}: bad options: unknown option {echo_if_short(key)!r} "
                    f"(valid options: {known})"
                )
        try:
            return self.factory(**opts)
        except ConfigError:
            raise
        except ValueError as exc:
            # A factory's ValueError is its sentence about a value the user gave.
            raise ConfigError(f"provider {self.kind}: bad options: {str(exc)[:300]}") from None
        except TypeError:
            # A TypeError's text names internal classes and signatures, not the option.
            raise ConfigError(
                f"provider {self.kind}: bad options: an option has the wrong type "
                f"(valid options: {known})"
            ) from None


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
            dist = KNOWN_PROVIDERS.get(kind)
            advice = (
                f"install it: pip install {dist}"
                if dist is not None
                else "install the distribution that provides it"
            )
            raise ConfigError(
                f"unknown provider kind {echo_if_short(kind)!r} "
                f"(installed: {known}); {advice}{broken}"
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
