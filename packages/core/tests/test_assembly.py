"""WorkspaceAssembly: open/resolve/close written once, around a provider's builder."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from corral import OperationError, ProviderConfig, SessionRef, WorkspaceFailedError, WorkspaceRef
from corral.provider import BuildContext, Modules, WorkspaceAssembly, positive_size_option

PROVIDER = "fake-assembled"


@attrs.frozen
class Payload:
    workspace: str
    max_file_bytes: int = attrs.field(validator=attrs.validators.gt(0))


class Builder:
    """Records every step; fails on demand at one named step of ``build``."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.storage: set[str] = set()
        self.fail_at: str | None = None
        self.fail_release: bool = False
        self.count = 0
        self.built: list[frozenset[str]] = []

    async def create(
        self, config: ProviderConfig, session: SessionRef, capabilities: frozenset[str]
    ) -> tuple[Payload, str]:
        self.count += 1
        name = f"ws-{session.session_id}-{self.count}"
        self.storage.add(name)
        return Payload(name, 7), f"opening-of-{session.session_id}"

    async def locate(self, payload: Payload) -> None:
        if payload.workspace not in self.storage:
            raise WorkspaceFailedError(f"{PROVIDER}: workspace was lost")

    async def destroy(self, payload: Payload) -> None:
        self.events.append(f"destroy {payload.workspace}")
        self.storage.discard(payload.workspace)

    async def build(self, ctx: BuildContext[Payload, str]) -> Modules:
        self.events.append(f"build fresh={ctx.fresh} opening={ctx.opening}")
        self.built.append(ctx.capabilities)
        for part in ("container", "fs", "shell"):
            if self.fail_at == part:
                raise OperationError(f"{part} failed", code="failed")
            ctx.releases.push_async_callback(self._release, part)
        stamped = ctx.stamp(Payload("ws-branch", 9))

        def details() -> dict[str, Any]:
            return {"provider": "overridden?", "branch_ref": stamped.payload}

        return Modules(details=details)

    async def _release(self, part: str) -> None:
        self.events.append(f"release {part}")
        if self.fail_release and part == "container":
            raise RuntimeError("the engine is gone too")


def assembly(builder: Builder) -> WorkspaceAssembly[Payload, str]:
    return WorkspaceAssembly(
        builder,
        provider_id=PROVIDER,
        capabilities=frozenset({"fs", "shell"}),
        schema_version=3,
        payload_type=Payload,
    )


CONFIG = ProviderConfig(PROVIDER)


@pytest.mark.anyio
async def test_open_stamps_the_ref_and_close_releases_newest_first_then_destroys() -> None:
    builder = Builder()
    opened = await assembly(builder).open(CONFIG, SessionRef("s"), frozenset({"fs"}))
    ref = opened.ref
    assert (ref.provider_id, ref.schema_version, ref.capabilities) == (PROVIDER, 3, {"fs"})
    assert ref.payload == {"workspace": "ws-s-1", "max_file_bytes": 7}
    assert opened.workspace.id == f"{PROVIDER}:ws-s-1"
    details = dict(opened.workspace.details())  # type: ignore[attr-defined]
    # provider and capabilities are the assembly's to state, not the builder's.
    assert details["provider"] == PROVIDER
    assert details["capabilities"] == ["fs"]
    assert details["branch_ref"] == {"workspace": "ws-branch", "max_file_bytes": 9}
    await opened.workspace.close()
    assert builder.events == [
        "build fresh=True opening=opening-of-s",
        "release shell",
        "release fs",
        "release container",
        "destroy ws-s-1",
    ]
    assert builder.storage == set()


@pytest.mark.anyio
async def test_a_failed_open_releases_what_was_built_and_removes_the_storage() -> None:
    builder = Builder()
    builder.fail_at = "shell"
    with pytest.raises(OperationError, match="shell failed"):
        await assembly(builder).open(CONFIG, SessionRef("s"))
    assert builder.events[1:] == ["release fs", "release container", "destroy ws-s-1"]
    assert builder.storage == set()


@pytest.mark.anyio
async def test_a_failed_resolve_releases_but_keeps_the_data() -> None:
    builder = Builder()
    asm = assembly(builder)
    opened = await asm.open(CONFIG, SessionRef("s"))
    builder.events.clear()
    builder.fail_at = "fs"
    with pytest.raises(OperationError, match="fs failed"):
        await asm.resolve(opened.ref)
    assert builder.events == ["build fresh=False opening=None", "release container"]
    assert builder.storage == {"ws-s-1"}


@pytest.mark.anyio
async def test_a_cleanup_failure_never_hides_why_the_build_failed() -> None:
    builder = Builder()
    builder.fail_at, builder.fail_release = "shell", True
    with pytest.raises(OperationError, match="shell failed"):
        await assembly(builder).open(CONFIG, SessionRef("s"))
    assert builder.events[-1] == "destroy ws-s-1"


@pytest.mark.anyio
async def test_open_refuses_a_foreign_kind_and_capabilities_it_lacks() -> None:
    builder = Builder()
    asm = assembly(builder)
    with pytest.raises(WorkspaceFailedError, match="another provider kind"):
        await asm.open(ProviderConfig("other"), SessionRef("s"))
    with pytest.raises(WorkspaceFailedError, match="cannot provide capabilities: code, snapshot"):
        await asm.open(CONFIG, SessionRef("s"), frozenset({"fs", "snapshot", "code"}))
    assert builder.storage == set()


@pytest.mark.anyio
async def test_resolve_checks_the_ref_before_touching_storage() -> None:
    builder = Builder()
    asm = assembly(builder)
    opened = await asm.open(CONFIG, SessionRef("s"))
    good = opened.ref
    again = await asm.resolve(good)
    assert again.id == opened.workspace.id
    evil = "<<EVIL>>"
    bad_refs = [
        attrs.evolve(good, provider_id="other"),
        attrs.evolve(good, schema_version=99),
        attrs.evolve(good, payload={"workspace": evil}),
        attrs.evolve(good, payload={"workspace": evil, "max_file_bytes": 0}),
        attrs.evolve(good, capabilities=frozenset({"fs", "code"})),
    ]
    builder.events.clear()
    for ref in bad_refs:
        with pytest.raises(WorkspaceFailedError) as info:
            await asm.resolve(ref)
        assert evil not in str(info.value)
    assert builder.events == []  # nothing was built for a bad ref
    lost = WorkspaceRef(PROVIDER, {"workspace": "ws-gone", "max_file_bytes": 1}, {"fs"}, 3)
    with pytest.raises(WorkspaceFailedError, match="lost"):
        await asm.resolve(lost)


def test_positive_size_option_refuses_what_is_not_a_positive_int() -> None:
    assert positive_size_option({}, "n", 5) == 5
    assert positive_size_option({"n": 3}, "n", 5) == 3
    for bad in (0, -1, True, 1.5, "3", None):
        assert positive_size_option({"n": bad}, "n", 5) is None


@pytest.mark.anyio
async def test_modules_a_provider_always_builds_are_built_and_listed_whatever_is_declared() -> None:
    builder = Builder()
    asm = WorkspaceAssembly(
        builder,
        provider_id=PROVIDER,
        capabilities=frozenset({"fs", "shell"}),
        schema_version=3,
        payload_type=Payload,
        always=frozenset({"fs"}),
    )
    opened = await asm.open(CONFIG, SessionRef("s"), frozenset())
    assert opened.ref.capabilities == {"fs"}
    assert builder.built == [frozenset({"fs"})]
    await asm.resolve(attrs.evolve(opened.ref, capabilities=frozenset({"shell"})))
    assert builder.built[-1] == {"fs", "shell"}
    with pytest.raises(ValueError, match="subset"):
        WorkspaceAssembly(
            builder,
            provider_id=PROVIDER,
            capabilities=frozenset({"fs"}),
            schema_version=3,
            payload_type=Payload,
            always=frozenset({"script"}),
        )
