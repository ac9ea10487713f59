"""corral-conformance: the provider contract suite.

Three ways to run it against a provider:

* ``pytest --corral-provider=KIND`` (the pytest plugin shipped in this wheel);
* subclass the abstract classes with your own fixtures
  (``class TestMine(AbstractProviderTests, MyFixtures): pass``);
* :func:`check_provider` from plain code, or ``corral conformance KIND``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.capability import lazy_exports

from ._defaults import DEFAULT_MAX_EXAMPLES

if TYPE_CHECKING:
    from ._check import SUITE_PATH, check_kind, check_provider, run_suite
    from ._fixtures import ProviderFixtures
    from ._harness import Harness, dump_tree
    from ._loopback import LoopbackListener, loopback_listener
    from ._model import FsModel, ModelError
    from ._reference import ReferenceProvider
    from ._report import ConformanceReport, ResultCollector, RuleResult
    from ._rules import RULES, Rule, define, rule
    from ._scenarios import DEEP_TREE_BUILD, deep_tree_scenario, heredoc_bypass_is_refused
    from ._script_scenarios import (
        script_allocation_bomb_scenario,
        script_fork_bomb_scenario,
        script_leaves_nothing_scenario,
        script_output_cap_scenario,
    )
    from ._suites import (
        AbstractCodeTests,
        AbstractFsTests,
        AbstractLifecycleTests,
        AbstractProcessTests,
        AbstractProviderTests,
        AbstractRefTests,
        AbstractScriptTests,
        AbstractSessionTests,
        AbstractShellTests,
        AbstractSnapshotTests,
    )
    from ._target import Target

__all__ = [
    "DEEP_TREE_BUILD",
    "DEFAULT_MAX_EXAMPLES",
    "RULES",
    "SUITE_PATH",
    "AbstractCodeTests",
    "AbstractFsTests",
    "AbstractLifecycleTests",
    "AbstractProcessTests",
    "AbstractProviderTests",
    "AbstractRefTests",
    "AbstractScriptTests",
    "AbstractSessionTests",
    "AbstractShellTests",
    "AbstractSnapshotTests",
    "ConformanceReport",
    "FsModel",
    "Harness",
    "LoopbackListener",
    "ModelError",
    "ProviderFixtures",
    "ReferenceProvider",
    "ResultCollector",
    "Rule",
    "RuleResult",
    "Target",
    "check_kind",
    "check_provider",
    "deep_tree_scenario",
    "define",
    "dump_tree",
    "heredoc_bypass_is_refused",
    "loopback_listener",
    "rule",
    "run_suite",
    "script_allocation_bomb_scenario",
    "script_fork_bomb_scenario",
    "script_leaves_nothing_scenario",
    "script_output_cap_scenario",
]

# Importing the package must stay cheap: the corral CLI loads its plugin module
# at every start. pytest and hypothesis load on first use of a name needing them.
_LAZY = {
    "DEEP_TREE_BUILD": "._scenarios",
    "deep_tree_scenario": "._scenarios",
    "heredoc_bypass_is_refused": "._scenarios",
    "script_allocation_bomb_scenario": "._script_scenarios",
    "script_fork_bomb_scenario": "._script_scenarios",
    "script_leaves_nothing_scenario": "._script_scenarios",
    "script_output_cap_scenario": "._script_scenarios",
    "SUITE_PATH": "._check",
    "check_kind": "._check",
    "check_provider": "._check",
    "run_suite": "._check",
    "ProviderFixtures": "._fixtures",
    "Harness": "._harness",
    "dump_tree": "._harness",
    "LoopbackListener": "._loopback",
    "loopback_listener": "._loopback",
    "FsModel": "._model",
    "ModelError": "._model",
    "ReferenceProvider": "._reference",
    "ConformanceReport": "._report",
    "ResultCollector": "._report",
    "RuleResult": "._report",
    "RULES": "._rules",
    "Rule": "._rules",
    "define": "._rules",
    "rule": "._rules",
    "AbstractCodeTests": "._suites",
    "AbstractFsTests": "._suites",
    "AbstractLifecycleTests": "._suites",
    "AbstractProcessTests": "._suites",
    "AbstractProviderTests": "._suites",
    "AbstractRefTests": "._suites",
    "AbstractScriptTests": "._suites",
    "AbstractSessionTests": "._suites",
    "AbstractShellTests": "._suites",
    "AbstractSnapshotTests": "._suites",
    "Target": "._target",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
