"""Per-rule results: collected from a pytest run, printed as a table or JSON.

Each result is one suite test; it carries the contract rule ids the test
checks (``@rule(...)``), so a failure names the sentences it broke. Failure
reasons are kept whole: the table wraps them, ``to_json`` keeps them verbatim.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable
from typing import Any, Literal

import attrs
import pytest

from ._rules import RULES, rules_of

__all__ = ["ConformanceReport", "ResultCollector", "RuleResult", "rule_of"]

Status = Literal["pass", "fail", "skip"]
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_.]*(?:Error|Exception)|Failed): ")
_RANK: dict[str, int] = {"skip": 0, "pass": 1, "fail": 2}


@attrs.frozen
class RuleResult:
    """The outcome of one rule (a named test, over every backend it ran on).

    Attributes:
        rule: The rule's name (the test name without ``test_``).
        group: The capability group (``fs``, ``shell``, ``refs``...).
        status: ``pass``, ``fail`` or ``skip``.
        reason: Why it failed or was skipped, in full; empty when it passed.
        rules: The contract rule ids the test checks.
        duration_s: Wall time of the test over every backend, in seconds.
    """

    rule: str
    group: str
    status: Status
    reason: str = ""
    rules: tuple[str, ...] = ()
    duration_s: float = 0.0

    @property
    def sentences(self) -> tuple[str, ...]:
        """``id: sentence (source)`` of every rule the test checks."""
        out = []
        for rid in self.rules:
            known = RULES.get(rid)
            out.append(f"{rid}: {known.sentence} ({known.source})" if known else rid)
        return tuple(out)


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

    def rule_statuses(self) -> dict[str, Status]:
        """Status per contract rule id: fail if any test carrying it failed, else pass/skip."""
        out: dict[str, Status] = {}
        for r in self.results:
            for rid in r.rules:
                old = out.get(rid)
                if old is None or _RANK[r.status] > _RANK[old]:
                    out[rid] = r.status
        return out

    def to_json(self) -> dict[str, Any]:
        """Machine-readable: provider, per-test and per-rule status, full reasons, sentences."""
        tests = [
            {
                "test": r.rule,
                "group": r.group,
                "status": r.status,
                "reason": r.reason,
                "rules": list(r.rules),
                "duration_s": round(r.duration_s, 3),
            }
            for r in self.results
        ]
        rules: dict[str, Any] = {}
        for rid, status in sorted(self.rule_statuses().items()):
            known = RULES.get(rid)
            carriers = [r for r in self.results if rid in r.rules]
            rules[rid] = {
                "status": status,
                "sentence": known.sentence if known else "",
                "source": known.source if known else "",
                "tests": [r.rule for r in carriers],
                "reasons": [r.reason for r in carriers if r.status == "fail"],
            }
        return {
            "provider": self.provider,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "duration_s": round(sum(r.duration_s for r in self.results), 3),
            "counts": {
                s: sum(r.status == s for r in self.results) for s in ("pass", "fail", "skip")
            },
            "tests": tests,
            "rules": rules,
        }

    def format_table(self, *, width: int = 120) -> str:
        """A plain-text table: rule, group, status, reason (wrapped, never cut).

        Under each failure, the contract sentences its test checks are listed.
        """
        name_w = max([len("rule"), *(len(r.rule) for r in self.results)])
        group_w = max([len("group"), *(len(r.group) for r in self.results)])
        lines = [f"{'rule':<{name_w}}  {'group':<{group_w}}  status  reason"]
        lines.append("-" * min(width, name_w + group_w + 24))
        indent = name_w + group_w + 12
        room = max(20, width - indent)
        pad = " " * indent
        for r in self.results:
            wrapped: list[str] = []
            for para in r.reason.splitlines() or [""]:
                wrapped += textwrap.wrap(para, room, break_long_words=True) or [""]
            lines.append(
                f"{r.rule:<{name_w}}  {r.group:<{group_w}}  {r.status:<6}  {wrapped[0]}".rstrip()
            )
            lines += [pad + more for more in wrapped[1:]]
            if r.status == "fail":
                for sentence in r.sentences:
                    for i, part in enumerate(textwrap.wrap(f"breaks {sentence}", room)):
                        lines.append(pad + ("" if i == 0 else "  ") + part)
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
    """The whole failure message, plus hypothesis's falsifying example when there is one."""
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ").strip()
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(longrepr)
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    extra: list[str] = []
    example: list[str] | None = None
    for raw in str(longrepr).splitlines():
        line = raw.lstrip("E|+ \t").rstrip()
        if example is not None:  # hypothesis prints an example over several lines
            example.append(line)
            if line == ")":
                joined = " ".join(example).replace("( ", "(").replace(", )", ")")
                if joined not in extra:
                    extra.append(joined)
                example = None
            continue
        if line.startswith(("Falsifying", "Failing explicit example")):
            if line.endswith("("):
                example = [line]
            elif line not in extra:
                extra.append(line)
            continue
        grouped = "ExceptionGroup" in text and _ERROR_LINE.match(line)
        if grouped and line not in lines + extra:
            extra.append(line)  # the sub-failures of a group
    return "\n".join([*lines, *extra])


class ResultCollector:
    """A pytest plugin that keeps one :class:`RuleResult` per rule.

    Args:
        only: Run just these tests: names without ``test_``, contract rule ids
            (``refs.version.reject``) or rule-id prefixes (``refs``,
            ``refs.version``); None runs all.
    """

    def __init__(self, only: Iterable[str] | None = None) -> None:
        self._only = frozenset(only) if only is not None else None
        self._rules: dict[str, tuple[str, str]] = {}
        self._ids: dict[str, tuple[str, ...]] = {}
        self._results: dict[str, RuleResult] = {}
        self._durations: dict[str, float] = {}

    def _wanted(self, name: str, ids: tuple[str, ...]) -> bool:
        if self._only is None or name in self._only:
            return True
        return any(rid == want or rid.startswith(f"{want}.") for rid in ids for want in self._only)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Keep the selected rules and remember which rule each item checks."""
        kept = []
        for item in items:
            rule, group = rule_of(item)
            ids = rules_of(item)
            if self._wanted(rule, ids):
                kept.append(item)
                self._rules[item.nodeid] = (rule, group)
                self._ids[rule] = ids
        if len(kept) != len(items):
            config.hook.pytest_deselected(items=[i for i in items if i not in kept])
            items[:] = kept

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Fold each phase's outcome into its rule's result (fail > pass > skip)."""
        if report.nodeid not in self._rules:
            return
        rule, group = self._rules[report.nodeid]
        self._durations[rule] = self._durations.get(rule, 0.0) + report.duration
        if report.failed:
            status: Status = "fail"
        elif report.skipped:
            status = "skip"
        elif report.when == "call":
            status = "pass"
        else:
            return
        new = RuleResult(
            rule, group, status, "" if status == "pass" else _reason(report), self._ids[rule]
        )
        old = self._results.get(rule)
        if old is None or _RANK[new.status] > _RANK[old.status]:
            self._results[rule] = new

    def report(self, provider: str, exit_code: int) -> ConformanceReport:
        """The report of the finished run."""
        results = tuple(
            attrs.evolve(r, duration_s=self._durations.get(r.rule, 0.0))
            for r in self._results.values()
        )
        return ConformanceReport(provider, results, int(exit_code))
