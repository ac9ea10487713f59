"""Repository-wide test configuration.

* Every async test runs on trio and asyncio.
* Under CI (``CI=true``, as ``.ci/run`` is invoked) hypothesis is derandomised:
  the same examples every run, so CI never flakes on a lucky draw; local runs
  keep exploring new examples.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true"):
    settings.load_profile("ci")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Parametrise ``@pytest.mark.anyio`` tests over both backends."""
    return str(request.param)
