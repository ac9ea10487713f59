"""The README's list of failing standard tests is the test module's KNOWN_FAILURES."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _known_failures() -> dict[str, tuple[str, bool]]:
    spec = importlib.util.spec_from_file_location("_standard", HERE / "test_standard.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.KNOWN_FAILURES)


def test_readme_lists_exactly_the_known_failures() -> None:
    readme = (HERE.parent / "README.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(test_\w+)` \| (.+?) \|$", readme, flags=re.MULTILINE))
    known = {name: reason for name, (reason, _) in _known_failures().items()}
    assert rows == known
