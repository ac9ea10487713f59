"""Every distribution declares what it imports, and siblings pin each other.

``pip install corral-local-bash`` must be enough for corral-local-bash: a
package that imports ``anyio`` but relies on corral-core to pull it in
breaks as soon as core's floor moves (it did: posix-core used an anyio
function newer than core's declared minimum). Siblings are released
together, so each pins the others to the exact version.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[2]
IMPORT_TO_DIST = {
    "corral": "corral-core",
    "corral_posix": "corral-posix-core",
    "re2": "google-re2",
    "pydantic_ai": "pydantic-ai-slim",
    "agents": "openai-agents",
}
"""Import names whose distribution is named differently."""


def _pyprojects() -> list[Path]:
    return sorted(p for p in PACKAGES.glob("*/pyproject.toml"))


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert match is not None, requirement
    return match.group(0).lower().replace("_", "-")


def _third_party_imports(src: Path) -> set[str]:
    found: set[str] = set()
    for file in src.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    own = {d.name for d in src.iterdir() if d.is_dir()}
    return found - set(sys.stdlib_module_names) - {"__future__"} - own


@pytest.mark.parametrize("pyproject", _pyprojects(), ids=lambda p: p.parent.name)
def test_every_import_is_declared(pyproject: Path) -> None:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    declared = {_name(r) for r in project.get("dependencies", [])}
    for extra in project.get("optional-dependencies", {}).values():
        declared |= {_name(r) for r in extra}
    imports = _third_party_imports(pyproject.parent / "src")
    missing = sorted(
        name for name in imports if IMPORT_TO_DIST.get(name, name).replace("_", "-") not in declared
    )
    assert not missing, f"{project['name']} imports {missing} without declaring them"


def test_siblings_pin_each_others_version() -> None:
    versions = {}
    requirements = {}
    for pyproject in _pyprojects():
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        versions[project["name"]] = project["version"]
        requirements[project["name"]] = project.get("dependencies", [])
    assert len(set(versions.values())) == 1, f"siblings disagree on the version: {versions}"
    for name, reqs in requirements.items():
        for req in reqs:
            dist = _name(req)
            if dist in versions:
                assert req == f"{dist}=={versions[dist]}", f"{name}: {req!r} is not an exact pin"
