"""Which suite a scenario runs in is where it lives: every test in tests/chaos is
`chaos_only` (`make chaos`, TWINSTREAM_CHAOS_FULL=1), and none in tests/integration is
(`make test` runs every one of those). A scenario moved between them moves its file."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def _marks(node: ast.expr) -> set[str]:
    """The names of pytest.mark.<name> (called or not) anywhere in an expression."""
    return {
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Attribute)
        and n.value.attr == "mark"
    }


def chaos_only_by_test(path: Path) -> dict[str, bool]:
    """Each test function of a module: whether it, or the whole module, is `chaos_only`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module_marks: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            module_marks |= _marks(node.value)
    return {
        node.name: "chaos_only" in module_marks
        or any("chaos_only" in _marks(d) for d in node.decorator_list)
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }


def test_the_reader_sees_a_decorator_and_a_module_mark(tmp_path: Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text(
        "import pytest\n"
        "@pytest.mark.chaos_only\ndef test_a(): pass\n"
        "@pytest.mark.timeout(5)\ndef test_b(): pass\n"
    )
    assert chaos_only_by_test(module) == {"test_a": True, "test_b": False}
    module.write_text("import pytest\npytestmark = [pytest.mark.chaos_only]\ndef test_c(): pass\n")
    assert chaos_only_by_test(module) == {"test_c": True}


@pytest.mark.parametrize(("suite", "chaos_only"), [("chaos", True), ("integration", False)])
def test_every_chaos_scenario_lives_in_tests_chaos_and_only_there(
    suite: str, chaos_only: bool
) -> None:
    found = {
        f"{path.name}::{name}": marked
        for path in sorted((TESTS / suite).glob("test_*.py"))
        for name, marked in chaos_only_by_test(path).items()
    }
    assert found, f"no test found in tests/{suite}"
    assert {t for t, marked in found.items() if marked is not chaos_only} == set()
