"""The package is laid out in wings by process, and its imports point one way.

contract (the users' API) <- platform (settings, pipelines file, Kafka clients, storage,
the token check and metrics every server shares) <- core (the failover protocol) <- engine
(what runs in an engine process, and the one client of its API) and, beside it, edge (the
publisher and subscriber adapters) <- testing (the users' test kit) <- stack (the local
platform's processes) <- ops (what Airflow, the operator page and the CLI run). A module
imports only its own wing and the wings of the tiers before it: engine and edge, one tier,
import nothing of each other. No two modules import each other, even through others;
nothing in the product imports the developers' kit (devkit, tests, bench). The failover
core knows no pipeline and no Settings: it reaches only itself, the connection configs it
is given and the storage checkpoints live on.
Read from the sources (no import is run), so a function-level import counts too."""

from __future__ import annotations

import ast

from twinstream.platform.settings import REPO_ROOT

PACKAGE = REPO_ROOT / "include" / "twinstream"
# The wings in tiers, lowest first: a wing imports its own tier's modules only from itself.
TIERS: tuple[tuple[str, ...], ...] = (
    ("contract",),
    ("platform",),
    ("core",),
    ("engine", "edge"),
    ("testing",),
    ("stack",),
    ("ops",),
)
WINGS = tuple(w for tier in TIERS for w in tier)
# What the core may reach outside itself: the small connection configs it is given (never
# the whole Settings) and the file systems checkpoints live on.
CORE_ALLOWED = frozenset({"platform", "platform.connections", "platform.storage"})
DEV_KIT = ("devkit", "tests", "bench")


def imports(source: str) -> set[str]:
    """Every module a source imports, anywhere in it (`from a import b` names a and a.b)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def twinstream_imports(source: str) -> set[str]:
    """The twinstream modules a source imports, without the prefix."""
    return {n.split(".", 1)[1] for n in imports(source) if n.startswith("twinstream.")}


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


def wing(module: str) -> str:
    return module.split(".", 1)[0]


def tier(module: str) -> int:
    return next(i for i, wings in enumerate(TIERS) if wing(module) in wings)


def backward(read: dict[str, str]) -> list[str]:
    """`importer -> imported` for each import that points from a wing to a later tier's, or
    to another wing of its own tier."""
    found = []
    for module, source in sorted(read.items()):
        for imported in sorted(twinstream_imports(source) & read.keys()):
            if wing(imported) != wing(module) and tier(imported) >= tier(module):
                found.append(f"{module} -> {imported}")
    return found


def circles(read: dict[str, str]) -> list[list[str]]:
    """Modules that reach themselves through their imports (each circle once)."""
    graph = {m: sorted(twinstream_imports(s) & read.keys() - {m}) for m, s in read.items()}
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            module, path = stack.pop()
            for imported in graph[module]:
                if imported == start and frozenset(path) not in seen:
                    seen.add(frozenset(path))
                    found.append(path)
                elif imported not in path and imported > start:
                    stack.append((imported, [*path, imported]))
    return found


def test_every_module_stands_in_a_wing():
    strays = sorted(m for m in package_sources() if wing(m) not in WINGS)
    assert strays == [], f"modules outside the wings {WINGS}: {strays}"


def test_imports_point_from_a_wing_only_to_itself_and_the_tiers_before_it():
    assert backward(package_sources()) == []


def test_no_module_of_edge_imports_engine_and_none_of_engine_imports_edge():
    sources = package_sources()
    sideways = [
        f"{module} -> {imported}"
        for module, source in sorted(sources.items())
        for imported in sorted(twinstream_imports(source) & sources.keys())
        if {wing(module), wing(imported)} == {"edge", "engine"}
    ]
    assert sideways == []


def test_no_two_modules_of_the_product_import_each_other():
    assert circles(package_sources()) == []


def test_the_product_imports_nothing_of_the_developers_kit():
    offenders = sorted(
        f"{module} -> {name}"
        for module, source in package_sources().items()
        for name in imports(source)
        if name.split(".", 1)[0] in DEV_KIT
    )
    assert offenders == []


def test_the_core_reaches_only_itself_and_the_plumbing():
    sources = package_sources()
    core = tuple(m for m in sources if wing(m) == "core")
    assert {"core.election", "core.gate", "core.outbound", "core.rows"} <= set(core)
    via = reached(core, sources)
    outside = {m: importer for m, importer in via.items() if m not in CORE_ALLOWED}
    assert outside == {}, f"the core reaches these (module: imported by) {outside}"


def test_the_checks_see_an_import_inside_a_function_through_another_module_and_a_circle():
    read = {
        "core.gate": "def f():\n    from twinstream.core import rows\n",
        "core.rows": "import twinstream.engine.app\n",
        "engine.app": "from twinstream.core.gate import Gate\n",
    }
    assert reached(("core.gate",), read) == {"core.rows": "core.gate", "engine.app": "core.rows"}
    assert backward(read) == ["core.rows -> engine.app"]
    assert circles(read) == [["core.gate", "core.rows", "engine.app"]]
    assert circles({"a.x": "", "a.y": "import twinstream.a.x\n"}) == []
    siblings = {
        "edge.feed": "from twinstream.engine.api import token_problem\n",
        "engine.api": "from twinstream.core import rows\n",
        "core.rows": "",
    }
    assert backward(siblings) == ["edge.feed -> engine.api"]
