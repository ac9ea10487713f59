"""The abstract test classes, one per capability, and their union."""

from __future__ import annotations

from ._tests_fs import AbstractFsTests
from ._tests_lifecycle import AbstractLifecycleTests
from ._tests_refs import AbstractRefTests
from ._tests_sessions import AbstractSessionTests
from ._tests_shell import AbstractShellTests
from ._tests_snapshot import AbstractSnapshotTests

__all__ = [
    "AbstractFsTests",
    "AbstractLifecycleTests",
    "AbstractProviderTests",
    "AbstractRefTests",
    "AbstractSessionTests",
    "AbstractShellTests",
    "AbstractSnapshotTests",
]


# pytest collects inherited tests base-last-first; this order runs the session
# and ref rules before the per-capability ones.
class AbstractProviderTests(
    AbstractLifecycleTests,
    AbstractSnapshotTests,
    AbstractShellTests,
    AbstractFsTests,
    AbstractRefTests,
    AbstractSessionTests,
):
    """Every rule; capabilities the provider does not advertise are skipped."""
