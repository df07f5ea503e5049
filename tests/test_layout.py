"""The house's rooms say what they hold: every subpackage has a docstring and an `__all__` naming all its
modules (and, where the room re-exports them, public names that resolve)
(the layer rule itself is import-linter's contract in .importlinter, run by .ci/run)."""

import importlib
from pathlib import Path

import pytest

import loracls

PACKAGES = sorted(p.name for p in Path(loracls.__file__).parent.iterdir() if (p / "__init__.py").is_file())


@pytest.mark.parametrize("name", PACKAGES)
def test_each_subpackage_states_its_purpose_and_its_public_modules(name):
    package = importlib.import_module(f"loracls.{name}")
    assert package.__doc__ and len(package.__doc__.split()) >= 8
    modules = {p.stem for p in Path(package.__file__).parent.glob("*.py") if p.stem != "__init__"}
    assert modules <= set(package.__all__)
    for name in package.__all__:
        assert getattr(package, name, None) is not None or name in modules, name
