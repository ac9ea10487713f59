"""A real multi-node Ray cluster on this machine, started by the tests themselves.

A head and two workers, each a separate ``ray start`` (own raylet, own
process group) with a distinct custom resource (``head``, ``w1``, ``w2``),
one CPU each, no dashboard, a small object store and fast node-death
detection (:class:`corral_ray.testing.LocalCluster`). Shared by every test
of the session; torn down by process group.

Without Ray the suite skips, unless CORRAL_REQUIRE_RAY=1 (CI), where it fails.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator

import pytest

from corral_ray.testing import RAY_TEST_ENV, LocalCluster, processes_matching


def _unavailable(reason: str) -> None:
    if os.environ.get("CORRAL_REQUIRE_RAY") == "1":
        pytest.fail(f"a Ray cluster is required (CORRAL_REQUIRE_RAY=1) but unavailable: {reason}")
    pytest.skip(f"a Ray cluster is unavailable: {reason}")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[LocalCluster]:
    """A head and two workers with resources ``head``, ``w1``, ``w2``; this process attached."""
    os.environ.update(RAY_TEST_ENV)  # before ray is imported: it reads some at import
    try:
        import ray
    except ImportError:
        _unavailable("ray is not installed")
    cluster = LocalCluster.create()
    try:
        # One at a time: nodes of one IP registering at once time each other out.
        for resource in ("head", "w1", "w2"):
            cluster.start_node(resource, head=resource == "head")
        ray.init(address=cluster.address, namespace="corral", log_to_driver=False)
    except Exception as exc:
        cluster.stop()
        _unavailable(f"could not start a local cluster ({type(exc).__name__}: {str(exc)[-700:]})")
    try:
        yield cluster
    finally:
        from corral_ray import shutdown_agents

        with contextlib.suppress(Exception):
            shutdown_agents()
        ray.shutdown()
        base = str(cluster.base)
        cluster.stop()
        # No node leaves anything behind: daemons, agents or workspace commands.
        deadline = time.monotonic() + 15
        while processes_matching(base) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = processes_matching(base)
        assert not left, f"{len(left)} processes of the test cluster outlived it"


def node_of(resource: str) -> str:
    """The node id of the alive node offering a custom resource."""
    import ray

    for node in ray.nodes():
        if node["Alive"] and node["Resources"].get(resource):
            return str(node["NodeID"])
    raise LookupError(resource)


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``predicate()`` until truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


_RAY_LOOP_LEAKS = (
    # Ray's client code calls asyncio.get_event_loop() in whatever thread drives
    # it (our calls run in anyio worker threads), creating loops it never closes;
    # the collector finds them (and their self-pipe socketpair) during a later
    # test. Only these two exact shapes are ignored, and only in this package.
    "ignore:Exception ignored in. <function BaseEventLoop.__del__"
    ":pytest.PytestUnraisableExceptionWarning",
    "ignore:Exception ignored in. <socket.socket fd=[0-9]+, family=1, type=1, proto=0>"
    ":pytest.PytestUnraisableExceptionWarning",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tolerate Ray's unclosed per-thread event loops in this package's tests (see above)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.path).startswith(here):
            for spec in _RAY_LOOP_LEAKS:
                item.add_marker(pytest.mark.filterwarnings(spec))
