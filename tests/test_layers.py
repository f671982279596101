"""The package layering (docs/architecture.md): entry points (``apps``) → ``orchestration`` → ``observability``,
``deployments``, ``trainers`` → ``agents`` → ``configs``. Nothing imports upward, ``deployments`` and ``trainers``
never import each other; read from every module's import statements, function-level imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[1]
MAY_IMPORT = {
    "configs": set(),
    "agents": {"configs"},
    "deployments": {"configs", "agents"},
    "trainers": {"configs", "agents"},
    "observability": {"configs", "agents"},
    "orchestration": {"configs", "agents", "deployments", "trainers", "observability"},
    "apps": {"configs", "agents", "deployments", "trainers", "observability", "orchestration"},
}
PROJECT = set(MAY_IMPORT) | {"benchmarks", "tests", "scripts"}


def project_imports(path: Path) -> set[tuple[str, int]]:
    """(top-level project package, line) of every import in a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {(name.split(".")[0], node.lineno) for name in names if name.split(".")[0] in PROJECT}
    return found


def upward_imports(root: Path) -> list[str]:
    bad = []
    for package, allowed in MAY_IMPORT.items():
        for path in sorted((root / package).rglob("*.py")):
            for imported, line in sorted(project_imports(path)):
                if imported != package and imported not in allowed:
                    bad.append(f"{path.relative_to(root)}:{line} imports {imported} (a {package} module may import "
                               f"{', '.join(sorted(allowed)) or 'no other project package'})")
    return bad


def test_no_package_imports_upward_or_sideways():
    assert upward_imports(ROOT) == []


def test_integrations_import_no_project_package():
    """They are installed into other environments (Agent Lightning 0.3.x's), where none of tandem-rl's packages are."""
    found = {f"{path.relative_to(ROOT)}:{line} imports {name}" for path in sorted((ROOT / "integrations").rglob("*.py"))
             for name, line in project_imports(path)}
    assert sorted((ROOT / "integrations").rglob("*.py")) and found == set()


def test_the_layer_table_is_acyclic():
    order, seen = [], set()

    def visit(package: str, path: tuple[str, ...]) -> None:
        assert package not in path, f"cycle: {' → '.join(path + (package,))}"
        if package not in seen:
            for lower in MAY_IMPORT[package]:
                visit(lower, path + (package,))
            seen.add(package)
            order.append(package)

    for package in MAY_IMPORT:
        visit(package, ())
    assert order[0] == "configs" and order[-1] == "apps"


def test_an_upward_import_is_reported_with_its_file_and_line(tmp_path):
    for package in MAY_IMPORT:
        (tmp_path / package).mkdir()
    (tmp_path / "trainers" / "bad.py").write_text("import os\n\n\ndef f():\n    from orchestration.run import TrainingRun\n")
    assert upward_imports(tmp_path) == [
        "trainers/bad.py:5 imports orchestration (a trainers module may import agents, configs)"]
