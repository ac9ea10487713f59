"""The abstract test classes, one per capability, and their union.

They hold the tests; ``_shipped_suite`` binds them to the provider under test.
"""

from __future__ import annotations

from ._tests_code import AbstractCodeTests
from ._tests_fs import AbstractFsTests
from ._tests_lifecycle import AbstractLifecycleTests
from ._tests_process import AbstractProcessTests
from ._tests_refs import AbstractRefTests
from ._tests_script import AbstractScriptTests
from ._tests_sessions import AbstractSessionTests
from ._tests_shell import AbstractShellTests
from ._tests_snapshot import AbstractSnapshotTests
from ._tests_versions import AbstractVersionsTests

__all__ = [
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
    "AbstractVersionsTests",
]


# pytest collects inherited tests base-last-first; this order runs the session
# and ref rules before the per-capability ones.
class AbstractProviderTests(
    AbstractLifecycleTests,
    AbstractProcessTests,
    AbstractCodeTests,
    AbstractScriptTests,
    AbstractVersionsTests,
    AbstractSnapshotTests,
    AbstractShellTests,
    AbstractFsTests,
    AbstractRefTests,
    AbstractSessionTests,
):
    """Every rule; capabilities the provider does not advertise are skipped."""
