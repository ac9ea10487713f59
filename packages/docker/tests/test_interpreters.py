"""One probe, two readings: the code and script languages of an image's interpreters."""

from __future__ import annotations

import pytest

from corral_docker._interpreters import code_languages, script_languages


@pytest.mark.parametrize(
    ("programs", "code", "script"),
    [
        (set(), set(), set()),
        ({"bash", "node"}, set(), {"javascript"}),  # no python3: no code driver at all
        ({"python3"}, {"python"}, {"python"}),
        ({"python3", "bash", "node"}, {"python", "bash", "javascript"}, {"python", "javascript"}),
    ],
)
def test_each_module_reads_the_same_probe(
    programs: set[str], code: set[str], script: set[str]
) -> None:
    found = frozenset(programs)
    assert code_languages(found) == code
    assert script_languages(found) == script
