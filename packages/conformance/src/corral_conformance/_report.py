"""Per-rule results: collected from a pytest run, printed as a table."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import attrs
import pytest

__all__ = ["ConformanceReport", "ResultCollector", "RuleResult", "rule_of"]

Status = Literal["pass", "fail", "skip"]
_RANK: dict[str, int] = {"skip": 0, "pass": 1, "fail": 2}


@attrs.frozen
class RuleResult:
    """The outcome of one rule (a named test, over every backend it ran on).

    Attributes:
        rule: The rule's name (the test name without ``test_``).
        group: The capability group (``fs``, ``shell``, ``refs``...).
        status: ``pass``, ``fail`` or ``skip``.
        reason: Why it failed or was skipped; empty when it passed.
    """

    rule: str
    group: str
    status: Status
    reason: str = ""


@attrs.frozen
class ConformanceReport:
    """Everything one conformance run found.

    Attributes:
        provider: The provider id under test.
        results: One entry per rule, in run order.
        exit_code: pytest's exit status (non-zero on failures or errors).
    """

    provider: str
    results: tuple[RuleResult, ...]
    exit_code: int

    @property
    def ok(self) -> bool:
        """No rule failed and pytest itself reported no error."""
        return self.exit_code in (0, pytest.ExitCode.NO_TESTS_COLLECTED) and not self.failed

    @property
    def failed(self) -> tuple[RuleResult, ...]:
        """The rules that failed."""
        return tuple(r for r in self.results if r.status == "fail")

    def result(self, rule: str) -> RuleResult:
        """The result of one rule.

        Raises:
            KeyError: The rule did not run.
        """
        for r in self.results:
            if r.rule == rule:
                return r
        raise KeyError(rule)

    def format_table(self, *, width: int = 120) -> str:
        """A plain-text table: rule, group, status, reason."""
        name_w = max([len("rule"), *(len(r.rule) for r in self.results)])
        group_w = max([len("group"), *(len(r.group) for r in self.results)])
        lines = [f"{'rule':<{name_w}}  {'group':<{group_w}}  status  reason"]
        lines.append("-" * min(width, name_w + group_w + 24))
        room = max(20, width - name_w - group_w - 12)
        for r in self.results:
            reason = r.reason if len(r.reason) <= room else r.reason[: room - 1] + "…"
            lines.append(f"{r.rule:<{name_w}}  {r.group:<{group_w}}  {r.status:<6}  {reason}")
        counts = {s: sum(r.status == s for r in self.results) for s in ("pass", "fail", "skip")}
        lines.append(
            f"{self.provider}: {counts['pass']} passed, {counts['fail']} failed, "
            f"{counts['skip']} skipped"
        )
        return "\n".join(lines)


def rule_of(item: pytest.Item) -> tuple[str, str]:
    """The rule name and capability group of a collected suite test."""
    name = getattr(item, "originalname", item.name).removeprefix("test_")
    func = getattr(item, "function", None)
    owner = getattr(func, "__qualname__", "").split(".")[0]
    if not owner.startswith("Abstract"):
        return name, "plugin"
    group = owner.removeprefix("Abstract").removesuffix("Tests").lower()
    return name, group


def _reason(report: pytest.TestReport) -> str:
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        text = str(longrepr[2]).removeprefix("Skipped: ")
    else:
        crash = getattr(longrepr, "reprcrash", None)
        text = crash.message if crash is not None else str(longrepr)
    return " ".join(text.split("\n")[0].split())


class ResultCollector:
    """A pytest plugin that keeps one :class:`RuleResult` per rule.

    Args:
        only: Run just these rules (names without ``test_``); None runs all.
    """

    def __init__(self, only: Iterable[str] | None = None) -> None:
        self._only = frozenset(only) if only is not None else None
        self._rules: dict[str, tuple[str, str]] = {}
        self._results: dict[str, RuleResult] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Keep the selected rules and remember which rule each item checks."""
        kept = []
        for item in items:
            rule, group = rule_of(item)
            if self._only is None or rule in self._only:
                kept.append(item)
                self._rules[item.nodeid] = (rule, group)
        if len(kept) != len(items):
            config.hook.pytest_deselected(items=[i for i in items if i not in kept])
            items[:] = kept

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Fold each phase's outcome into its rule's result (fail > pass > skip)."""
        if report.nodeid not in self._rules:
            return
        if report.failed:
            status: Status = "fail"
        elif report.skipped:
            status = "skip"
        elif report.when == "call":
            status = "pass"
        else:
            return
        rule, group = self._rules[report.nodeid]
        new = RuleResult(rule, group, status, "" if status == "pass" else _reason(report))
        old = self._results.get(rule)
        if old is None or _RANK[new.status] > _RANK[old.status]:
            self._results[rule] = new

    def report(self, provider: str, exit_code: int) -> ConformanceReport:
        """The report of the finished run."""
        return ConformanceReport(provider, tuple(self._results.values()), int(exit_code))
