"""The failover core knows no pipeline: `twinstream.core` (election, gate, fencing, rows
and headers, quarantine, checkpoint rewind) reaches, directly or through what it imports,
only itself and the shared plumbing (settings, Kafka client configuration, the file
systems checkpoints live on, the JSON guard's limits). Read from the sources (no import is
run), so a function-level import counts too."""

from __future__ import annotations

import ast

from twinstream.config import REPO_ROOT

PACKAGE = REPO_ROOT / "include" / "twinstream"
# What the core may reach outside itself: plumbing that knows no pipeline either.
# kafka_auth: who a Kafka client is (its user), part of the client plumbing like kafka.
ALLOWED = ("config", "kafka", "kafka_auth", "storage")


def twinstream_imports(source: str) -> set[str]:
    """The twinstream modules a source imports, anywhere in it, without the prefix."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
            if node.module.startswith("twinstream"):  # from twinstream.core import gate
                names += [f"{node.module}.{alias.name}" for alias in node.names]
        found |= {n.split(".", 1)[1] for n in names if n.startswith("twinstream.")}
    return found


def reached(start: tuple[str, ...], read: dict[str, str]) -> dict[str, str]:
    """Every twinstream module reached from `start` (that exists in `read`), with the
    module that imports it."""
    via: dict[str, str] = {}
    todo = list(start)
    while todo:
        module = todo.pop()
        source = read.get(module)
        if source is None:
            continue
        for imported in sorted(twinstream_imports(source) & read.keys()):
            if imported not in via and imported not in start:
                via[imported] = module
                todo.append(imported)
    return via


def package_sources() -> dict[str, str]:
    """Module (dotted, without `twinstream.`) -> source, packages as their __init__."""
    sources: dict[str, str] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            sources[".".join(parts)] = path.read_text()
    return sources


def test_the_core_reaches_only_itself_and_the_plumbing():
    sources = package_sources()
    core = tuple(m for m in sources if m == "core" or m.startswith("core."))
    assert {"core.election", "core.gate", "core.outbound", "core.rows"} <= set(core)
    via = reached(core, sources)
    outside = {m: importer for m, importer in via.items() if m not in ALLOWED}
    assert outside == {}, f"the core reaches these (module: imported by) {outside}"


def test_the_check_sees_an_import_inside_a_function_and_through_another_module():
    read = {
        "core.gate": "def f():\n    from twinstream.core import rows\n",
        "core.rows": "import twinstream.hostmetrics\n",
        "hostmetrics": "",
    }
    assert reached(("core.gate",), read) == {
        "core.rows": "core.gate",
        "hostmetrics": "core.rows",
    }
