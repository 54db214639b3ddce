"""The failover core knows no pipeline: election, gate, fencing and rows import no example,
directly or through what they import. Read from the sources (no import is run), so a
function-level import counts too."""

from __future__ import annotations

import ast

from twinstream.config import REPO_ROOT

PACKAGE = REPO_ROOT / "include" / "twinstream"
CORE = ("election", "gate", "outbound", "rows", "quarantine", "checkpoint")
# What no module of the core may reach: pipelines and the test and benchmark kits.
EXAMPLES = ("hostmetrics", "pipeline", "publisher", "subscriber")
KITS = ("harness", "chaos", "testing", "baseline", "plots")


def twinstream_imports(source: str) -> set[str]:
    """The twinstream modules a source imports, anywhere in it, without the prefix."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
            if node.module == "twinstream":  # from twinstream import gate
                names = [f"twinstream.{alias.name}" for alias in node.names]
        found |= {n.split(".", 1)[1] for n in names if n.startswith("twinstream.")}
    return found


def reached(start: tuple[str, ...], read: dict[str, str]) -> dict[str, str]:
    """Every twinstream module reached from `start`, with the module that imports it."""
    via: dict[str, str] = {}
    todo = list(start)
    while todo:
        module = todo.pop()
        source = read.get(module)
        if source is None:
            continue
        for imported in sorted(twinstream_imports(source)):
            top = imported.split(".")[0]
            if top not in via and top not in start:
                via[top] = module
                todo.append(top)
    return via


def package_sources() -> dict[str, str]:
    sources = {p.stem: p.read_text() for p in PACKAGE.glob("*.py")}
    sources |= {p.name: "" for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    return sources


def test_the_core_reaches_no_pipeline_and_no_test_kit():
    via = reached(CORE, package_sources())
    forbidden = {m: importer for m, importer in via.items() if m in EXAMPLES + KITS}
    assert forbidden == {}, f"the core reaches these (module: imported by) {forbidden}"


def test_the_check_sees_an_import_inside_a_function_and_through_another_module():
    read = {
        "gate": "def f():\n    from twinstream import rows\n",
        "rows": "import twinstream.hostmetrics\n",
        "hostmetrics": "",
    }
    assert reached(("gate",), read) == {"rows": "gate", "hostmetrics": "rows"}
