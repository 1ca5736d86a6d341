"""The import rules of the layout (STYLE.md): shared/ never imports functions/ or tests/, a function
never imports another function, and nothing shipped imports the simulator."""
import ast
from pathlib import Path

import pytest

from tests.conftest import REPO


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


SHIPPED = sorted(p for d in ("shared", "functions") for p in (REPO / d).rglob("*.py"))


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(REPO)) for p in SHIPPED])
def test_import_rules(path):
    modules = imports_of(path)
    assert not any(m == "tests" or m.startswith("tests.") for m in modules), "shipped code imports tests/"
    if path.parts[-2] == "shared" or "shared" in path.relative_to(REPO).parts[:1]:
        assert not any(m.startswith("functions") for m in modules), "shared/ imports functions/"
    else:
        own = path.relative_to(REPO).parts[1]
        others = {m.split(".")[1] for m in modules if m.startswith("functions.") and m.count(".") >= 1}
        assert others <= {own}, f"{own} imports another function: {others - {own}}"


def test_functions_never_import_the_kubernetes_exceptions():
    for path in (REPO / "functions").rglob("*.py"):
        assert not any(m.startswith("kubernetes") for m in imports_of(path)), path
