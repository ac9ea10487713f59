"""The public surface: exactly the names in ``__all__``, each documented."""

from __future__ import annotations

import corral_conformance


def test_all_names_exist_and_are_documented() -> None:
    # pytest rewrites this package (it ships a pytest11 plugin), adding @py names.
    public = {n for n in dir(corral_conformance) if not n.startswith(("_", "@"))}
    modules = {"pytest_plugin"}  # submodules imported as a side effect
    assert set(corral_conformance.__all__) == public - modules - {"annotations"}
    for name in corral_conformance.__all__:
        obj = getattr(corral_conformance, name)
        if callable(obj):
            assert obj.__doc__, f"{name} has no docstring"


def test_abstract_classes_are_not_collected_by_name() -> None:
    for name in corral_conformance.__all__:
        assert not name.startswith("Test"), f"{name} would be collected by pytest"
