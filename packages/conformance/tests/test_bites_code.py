"""Proof that the code rules bite: one realistic defect per rule, around local-bash's code module.

Each broken provider is corral-local-bash with its ``code`` module wrapped by
ONE defect a code-interpreter author could plausibly ship (the peers'
failures in shared/notes/wave2.md: a context silently restarted, a kill
reported as if variables survived, errors printed instead of reported...).
Each case runs the code rules through ``check_provider`` and asserts that
the intended rules fail and no other code rule does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import pytest

import corral.provider
from corral import ExecResult, OperationError, ProviderConfig, SessionRef, WorkspaceRef
from corral.provider import OpenedWorkspace
from corral_conformance import check_provider

pytest.importorskip("corral_local_bash", reason="corral-local-bash is not installed")

CODE_RULES = ("code",)


class _Code:
    """The real code module, forwarded; defects override one method."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.ids: dict[str, str] = {}

    @property
    def languages(self) -> frozenset[str]:
        return self.inner.languages  # type: ignore[no-any-return]

    async def run_code(self, language: str, code: str, *, timeout_s: float) -> ExecResult:
        return await self.inner.run_code(language, code, timeout_s=timeout_s)  # type: ignore[no-any-return]

    async def create_context(self, language: str) -> str:
        return await self.inner.create_context(language)  # type: ignore[no-any-return]

    async def run_in_context(self, context_id: str, code: str, *, timeout_s: float) -> ExecResult:
        inner_id = self.ids.get(context_id, context_id)
        return await self.inner.run_in_context(inner_id, code, timeout_s=timeout_s)  # type: ignore[no-any-return]

    async def delete_context(self, context_id: str) -> None:
        await self.inner.delete_context(self.ids.get(context_id, context_id))


class _ReplacesLost(_Code):
    """A dead context is swapped for a fresh interpreter behind the caller's back."""

    async def run_in_context(self, context_id: str, code: str, *, timeout_s: float) -> ExecResult:
        try:
            return await super().run_in_context(context_id, code, timeout_s=timeout_s)
        except OperationError as exc:
            if exc.code != "lost":
                raise
            self.ids[context_id] = await self.inner.create_context("python")
            return await super().run_in_context(context_id, code, timeout_s=timeout_s)


class _KillSaysKept(_Code):
    """Tells the model its variables survived a kill (senpi PR #381)."""

    async def run_in_context(self, context_id: str, code: str, *, timeout_s: float) -> ExecResult:
        result = await super().run_in_context(context_id, code, timeout_s=timeout_s)
        return attrs.evolve(result, state="kept") if result.state == "lost" else result


class _OneNamespace(_Code):
    """Every context of a workspace is the same interpreter."""

    shared: str | None = None

    async def create_context(self, language: str) -> str:
        if self.shared is None:
            self.shared = await self.inner.create_context(language)
        return self.shared


class _KillsAtTimeout(_Code):
    """No interrupt: a timed-out cell restarts the interpreter, reported as if nothing was lost."""

    async def run_in_context(self, context_id: str, code: str, *, timeout_s: float) -> ExecResult:
        result = await super().run_in_context(context_id, code, timeout_s=timeout_s)
        if result.timed_out and result.state == "kept":
            await self.inner.restart_context(self.ids.get(context_id, context_id))
        return result


class _ErrorAsStderr(_Code):
    """Tracebacks printed to stderr and the cell reported as a success."""

    async def run_in_context(self, context_id: str, code: str, *, timeout_s: float) -> ExecResult:
        result = await super().run_in_context(context_id, code, timeout_s=timeout_s)
        if result.error is not None and not result.timed_out and result.state == "kept":
            return attrs.evolve(
                result, error=None, exit_code=0, stderr=result.stderr + result.error.traceback
            )
        return result


class _ValueAsText(_Code):
    """A dict value flattened to its repr string, as a text-only runner does."""

    async def run_in_context(self, context_id: str, code: str, *, timeout_s: float) -> ExecResult:
        result = await super().run_in_context(context_id, code, timeout_s=timeout_s)
        shown = [o for o in result.outputs if o.kind == "result"]
        if shown and (result.result_json or "").startswith("{"):
            text = shown[-1].data.get("text/plain", "")
            return attrs.evolve(result, result_json=json.dumps(text), outputs=())
        return result


class _BareLanguageError(_Code):
    """Refuses an unknown language without saying which ones exist."""

    async def create_context(self, language: str) -> str:
        if language not in self.languages:
            raise OperationError("unsupported language", code="invalid_argument")
        return await super().create_context(language)

    async def run_code(self, language: str, code: str, *, timeout_s: float) -> ExecResult:
        if language not in self.languages:
            raise OperationError("unsupported language", code="invalid_argument")
        return await super().run_code(language, code, timeout_s=timeout_s)


class _GlobalIds(_Code):
    """Context ids looked up in a process-wide table: another session's id works."""

    table: dict[str, _Code] = {}  # noqa: RUF012 - shared on purpose: this is the defect

    async def create_context(self, language: str) -> str:
        ctx = await super().create_context(language)
        _GlobalIds.table[ctx] = self
        return ctx

    async def run_in_context(self, context_id: str, code: str, *, timeout_s: float) -> ExecResult:
        owner = _GlobalIds.table.get(context_id, self)
        return await owner.inner.run_in_context(context_id, code, timeout_s=timeout_s)  # type: ignore[no-any-return]


class _BrokenCodeProvider:
    """corral-local-bash with its code module wrapped; everything else forwarded."""

    def __init__(self, defect: Callable[[Any], _Code]) -> None:
        from corral_local_bash import LocalBashProvider

        self._inner = LocalBashProvider()
        self._defect = defect

    provider_id = property(lambda self: self._inner.provider_id)
    capabilities = property(lambda self: self._inner.capabilities)
    schema_version = property(lambda self: self._inner.schema_version)

    def _wrap(self, ws: Any) -> corral.provider.ModularWorkspace:
        code = self._defect(ws.code) if ws.code is not None else None
        return corral.provider.ModularWorkspace(
            ws.id,
            fs=ws.fs,
            shell=ws.shell,
            code=code,
            snapshot=ws.snapshot,
            on_close=ws.close,
            details=ws.details,
        )

    async def open(
        self, config: ProviderConfig, session: SessionRef, declared: frozenset[str] | None = None
    ) -> OpenedWorkspace:
        opened = await self._inner.open(config, session, declared)
        return OpenedWorkspace(workspace=self._wrap(opened.workspace), ref=opened.ref)

    async def resolve(self, ref: WorkspaceRef) -> corral.provider.ModularWorkspace:
        return self._wrap(await self._inner.resolve(ref))


_CASES: list[tuple[Callable[[Any], _Code], tuple[str, ...]]] = [
    (_ReplacesLost, ("code_dead_context_is_lost_not_replaced",)),
    (
        _KillSaysKept,
        ("code_ignored_interrupt_is_reported_lost", "code_dead_context_is_lost_not_replaced"),
    ),
    (_OneNamespace, ("code_contexts_share_nothing",)),
    (_KillsAtTimeout, ("code_timeout_interrupts_and_keeps_state",)),
    (_ErrorAsStderr, ("code_errors_carry_name_value_traceback",)),
    (_ValueAsText, ("code_result_and_streams",)),
    (_BareLanguageError, ("code_languages_are_real",)),
    (_GlobalIds, ("code_unknown_context_is_not_found",)),
]


@pytest.mark.parametrize(("defect", "intended"), _CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_code_defect_fails_its_rule(
    defect: Callable[[Any], _Code], intended: tuple[str, ...]
) -> None:
    report = check_provider(lambda: _BrokenCodeProvider(defect), rules=CODE_RULES, shrink=False)
    for name in intended:
        result = report.result(name)
        assert result.status == "fail", f"{name} did not catch the defect: {result}"
        assert result.reason, f"{name} failed without a reason"
    failed = {r.rule for r in report.failed}
    extra = failed - set(intended)
    assert not extra, f"expected exactly {sorted(intended)} to fail, also failed: {sorted(extra)}"


def test_the_unbroken_module_passes_every_code_rule() -> None:
    report = check_provider(lambda: _BrokenCodeProvider(_Code), rules=CODE_RULES)
    assert report.ok, [f"{r.rule}: {r.reason}" for r in report.failed]
    ran = {r.rule for r in report.results if r.status == "pass"}
    assert {name for _, names in _CASES for name in names} <= ran, sorted(ran)
