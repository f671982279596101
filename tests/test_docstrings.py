"""Every public class and function of the packages says in a docstring what it is for: the API pages render them.

Public: module-level classes and functions, and classes nested in classes, whose names do not start with ``_``
(methods are not required). Read with ``ast``, so nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agents", "configs", "deployments", "trainers", "orchestration", "observability", "apps", "integrations")
Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def undocumented(path: Path, root: Path) -> list[str]:
    """``path:line name`` of each public class or function of one module that has no docstring."""
    missing: list[str] = []

    def walk(body: list[ast.stmt], prefix: str, in_class: bool) -> None:
        for node in body:
            if not isinstance(node, Definition) or node.name.startswith("_"):
                continue
            if in_class and not isinstance(node, ast.ClassDef):
                continue  # a method
            if ast.get_docstring(node) is None:
                missing.append(f"{path.relative_to(root)}:{node.lineno} {prefix}{node.name}")
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}{node.name}.", True)

    walk(ast.parse(path.read_text(), filename=str(path)).body, "", False)
    return missing


def undocumented_in(root: Path, packages: tuple[str, ...]) -> list[str]:
    """``undocumented`` over every module of ``packages`` under ``root``."""
    return [entry for package in packages for path in sorted((root / package).rglob("*.py"))
            for entry in undocumented(path, root)]


def test_every_public_class_and_function_has_a_docstring():
    missing = undocumented_in(ROOT, PACKAGES)
    assert not missing, "public classes and functions without a docstring:\n" + "\n".join(missing)


def test_the_check_reports_what_lacks_a_docstring(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(
        '"""A module."""\n'
        "def bare(): pass\n"
        'def told():\n    """Says why."""\n'
        "def _private(): pass\n"
        "class Outer:\n"
        '    """Says why."""\n'
        "    def method(self): pass\n"
        "    class Inner: pass\n"
        "async def waits(): pass\n"
    )
    assert undocumented_in(tmp_path, ("pkg",)) == [
        "pkg/mod.py:2 bare", "pkg/mod.py:9 Outer.Inner", "pkg/mod.py:10 waits"]
