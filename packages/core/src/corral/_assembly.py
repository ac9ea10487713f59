"""One way to assemble a provider: open, resolve, close and ref stamping, written once.

Every provider in this repository does the same dance around its own parts:
refuse a foreign config kind, check the declared capabilities against what
it can provide, create the workspace's storage, build its modules, release
whatever was built when a later step fails, stamp a ref with the provider id
and schema version; at resolve, check the ref, structure its payload
strictly, find the storage again and build the modules once more. A
:class:`WorkspaceAssembly` does that dance; a provider hands it a
:class:`WorkspaceBuilder` -- the parts only it knows (where storage lives,
how modules are built, what its ref payload holds) -- and delegates
``open`` and ``resolve`` to it. Every provider in this repository is a
builder: the tmpdir providers (local-bash, local-sandbox), docker (host
directory or remote volume, container lifecycle), in-memory (a process-wide
store) and isolate (no storage at all). It lives in core, not in the POSIX
plumbing, because nothing in it is POSIX: a provider for a hosted sandbox
builds through it too.

Release is a stack (:class:`contextlib.AsyncExitStack`): the builder pushes
the undo of each part as it builds it, so a failure half-way releases
exactly what exists, and close releases it all, newest first, before the
builder removes the storage.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

import anyio
import attrs

from ._data import ProviderConfig, SessionRef, WorkspaceRef
from ._errors import WorkspaceFailedError
from ._protocols import CodeInterpreter, FileSystem, OpenedWorkspace, Shell, Snapshotter
from ._refs import check_ref, structure_payload, unstructure_payload
from ._workspace import ModularWorkspace

__all__ = [
    "BuildContext",
    "Modules",
    "WorkspaceAssembly",
    "WorkspaceBuilder",
    "WorkspacePayload",
    "positive_size_option",
]

log = logging.getLogger("corral.assembly")


class WorkspacePayload(Protocol):
    """What every ref payload an assembly handles names (an attrs class in practice).

    The payload class validates its own fields (attrs validators): resolve
    structures untrusted payloads into it strictly, and a value it refuses
    becomes a bare "malformed" error.
    """

    @property
    def workspace(self) -> str:
        """The workspace's name; the workspace id is ``<provider id>:<name>``."""
        ...


P = TypeVar("P", bound=WorkspacePayload)
O = TypeVar("O")  # noqa: E741 -- what create hands to build; a single letter as P
P_contra = TypeVar("P_contra", bound=WorkspacePayload, contravariant=True)


@attrs.frozen(kw_only=True)
class Modules:
    """The modules a builder built for one workspace.

    Attributes:
        fs: The filesystem the agent's tools use (already decorated).
        shell: The shell (already decorated).
        code: The code interpreter.
        script: The ephemeral script runner.
        snapshot: The snapshotter.
        extra: Further modules by module name (``process``, a third party's...).
        details: Returns the provider's facts for ``describe()``; the
            assembly adds ``provider`` and ``capabilities``.
    """

    fs: FileSystem | None = None
    shell: Shell | None = None
    code: CodeInterpreter | None = None
    script: CodeInterpreter | None = None
    snapshot: Snapshotter | None = None
    extra: Mapping[str, object] = attrs.field(factory=dict)
    details: Callable[[], Mapping[str, Any]] = dict


@attrs.frozen(kw_only=True)
class BuildContext(Generic[P, O]):
    """What a builder is told when it builds one workspace's modules.

    Attributes:
        payload: The workspace's ref payload.
        capabilities: The modules to build (a subset of the provider's).
        fresh: True at open: the storage was just created, and a failure
            removes it; False at resolve, where a failure leaves the data.
        opening: What ``create`` returned beside the payload; None at resolve.
        releases: Push the undo of every part as it is built (shell close,
            container removal, fd close); run newest first at close and
            when building fails.
        stamp: Makes the ref of a workspace of this provider with the same
            capabilities from a payload (a snapshotter's branch needs it).
    """

    payload: P
    capabilities: frozenset[str]
    fresh: bool
    opening: O | None
    releases: contextlib.AsyncExitStack
    stamp: Callable[[P], WorkspaceRef]


class WorkspaceBuilder(Protocol[P, O]):
    """The parts of a provider that only it knows; a :class:`WorkspaceAssembly` does the rest."""

    async def create(
        self, config: ProviderConfig, session: SessionRef, capabilities: frozenset[str]
    ) -> tuple[P, O]:
        """Parse the session's options and create the workspace's storage.

        Returns:
            The ref payload naming the new storage, and anything ``build``
            needs only at open (e.g. a pooled container to adopt).

        Raises:
            WorkspaceFailedError: Bad options or no storage.
        """
        ...

    async def locate(self, payload: P) -> None:
        """Check that the storage a ref names is still there and this provider's.

        Raises:
            WorkspaceFailedError: Malformed payload, or the workspace was lost.
        """
        ...

    async def build(self, ctx: BuildContext[P, O]) -> Modules:
        """Build the modules ``ctx.capabilities`` names, pushing each part's undo.

        Raises:
            WorkspaceFailedError: A module cannot be provided (fail closed).
        """
        ...

    async def destroy(self, payload: P) -> None:
        """Remove the workspace's storage and data (after its modules were released)."""
        ...


class WorkspaceAssembly(Generic[P, O]):
    """Open and resolve of a provider, around the parts its builder supplies.

    Holds only configuration (no per-session state), so one assembly serves
    every session of its provider.

    Args:
        builder: The provider's parts.
        provider_id: Stamped into refs and every error message.
        capabilities: The modules the provider can build.
        schema_version: Version of the ref payload (N-1 and N resolve).
        payload_type: The attrs class refs' payloads are structured into.
        always: Modules built whatever is declared, because the provider is
            useless without them (in-memory's ``fs``, isolate's ``script``);
            the ref lists them. Empty by default: build what is declared.
    """

    def __init__(
        self,
        builder: WorkspaceBuilder[P, O],
        *,
        provider_id: str,
        capabilities: frozenset[str],
        schema_version: int,
        payload_type: type[P],
        always: frozenset[str] = frozenset(),
    ) -> None:
        if not always <= capabilities:
            raise ValueError("always must be a subset of capabilities")
        self._builder = builder
        self._provider_id = provider_id
        self._capabilities = capabilities
        self._schema_version = schema_version
        self._payload_type = payload_type
        self._always = always

    def fail(self, message: str, *, transient: bool = False) -> WorkspaceFailedError:
        """A ``WorkspaceFailedError`` prefixed with the provider id."""
        return WorkspaceFailedError(
            f"{self._provider_id}: {message}", provider_id=self._provider_id, transient=transient
        )

    def ref(self, payload: P, capabilities: frozenset[str]) -> WorkspaceRef:
        """The ref of the workspace ``payload`` names, stamped with id and schema version."""
        return WorkspaceRef(
            provider_id=self._provider_id,
            payload=unstructure_payload(payload),
            capabilities=capabilities,
            schema_version=self._schema_version,
        )

    def _wanted(self, declared: frozenset[str] | None) -> frozenset[str]:
        if declared is None:
            return self._capabilities
        missing = sorted(set(declared) - self._capabilities)
        if missing:
            supported = ", ".join(sorted(self._capabilities))
            raise self.fail(
                f"cannot provide capabilities: {', '.join(missing)} (it supports {supported})"
            )
        return frozenset(declared) | self._always

    async def open(
        self,
        config: ProviderConfig,
        session: SessionRef,
        declared: frozenset[str] | None = None,
    ) -> OpenedWorkspace:
        """Create the workspace's storage and the modules declared (all when None).

        Raises:
            WorkspaceFailedError: A foreign config kind, a capability the
                provider lacks, or whatever the builder refuses.
        """
        if config.kind != self._provider_id:
            raise self.fail("the workspace config names another provider kind")
        caps = self._wanted(declared)
        payload, opening = await self._builder.create(config, session, caps)
        workspace = await self._assemble(payload, caps, fresh=True, opening=opening)
        return OpenedWorkspace(workspace=workspace, ref=self.ref(payload, caps))

    async def resolve(self, ref: WorkspaceRef) -> ModularWorkspace:
        """Check a ref, find its storage again and rebuild the modules it lists.

        Raises:
            WorkspaceFailedError: Foreign, malformed or unsupported ref;
                capabilities this provider lacks; a lost workspace. Messages
                never repeat the payload.
        """
        check_ref(ref, provider_id=self._provider_id, current=self._schema_version)
        payload = structure_payload(ref.payload, self._payload_type, provider_id=self._provider_id)
        caps = (ref.capabilities or self._capabilities) | self._always
        if caps - self._capabilities:
            raise self.fail("the ref lists capabilities this provider cannot provide")
        await self._builder.locate(payload)
        return await self._assemble(payload, caps, fresh=False, opening=None)

    async def _assemble(
        self, payload: P, caps: frozenset[str], *, fresh: bool, opening: O | None
    ) -> ModularWorkspace:
        releases = contextlib.AsyncExitStack()
        builder = self._builder

        async def close() -> None:
            try:
                await releases.aclose()
            finally:
                await builder.destroy(payload)

        ctx = BuildContext(
            payload=payload,
            capabilities=caps,
            fresh=fresh,
            opening=opening,
            releases=releases,
            stamp=lambda p: self.ref(p, caps),
        )
        try:
            modules = await builder.build(ctx)
        except BaseException:
            with anyio.CancelScope(shield=True):
                try:
                    await (close() if fresh else releases.aclose())
                except Exception:  # the failure that stopped the build matters more
                    log.warning(
                        "%s: cleanup after a failed open/resolve also failed", self._provider_id
                    )
            raise

        provider_id, extra = self._provider_id, modules.details

        def details() -> Mapping[str, Any]:
            # The builder's facts, then the two the assembly vouches for.
            return {**extra(), "provider": provider_id, "capabilities": sorted(caps)}

        return ModularWorkspace(
            f"{provider_id}:{payload.workspace}",
            fs=modules.fs,
            shell=modules.shell,
            code=modules.code,
            script=modules.script,
            snapshot=modules.snapshot,
            extra_modules=modules.extra,
            on_close=close,
            details=details,
        )


def positive_size_option(options: Mapping[str, object], name: str, default: int) -> int | None:
    """The positive integer option ``name`` (``default`` when absent); None when malformed.

    Booleans are refused although they are ints: ``True`` bytes is a mistake.
    """
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value
