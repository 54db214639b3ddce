"""The pipelines file: which pipelines this platform runs, and where their code lives.

    # pipelines.toml
    [hostmetrics]
    module = "pipelines.hostmetrics.pipeline"   # module[:attribute], attribute `pipeline`

The file's folder goes first on the Python path (and on PYTHONPATH, which Spark's Python
workers inherit), so a module beside it imports as it would in a test. Reading the file
is all that happens at import or DAG-parse time; a pipeline's module is imported only by
`load`, in the process that runs it.
"""

from __future__ import annotations

import difflib
import importlib.util
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from twinstream.contract import Pipeline, add_to_path
from twinstream.contract import load as load_module
from twinstream.platform import settings as environment
from twinstream.platform.settings import CommonSettings, SettingsError, TaskSettings
from twinstream.platform.versions import CodeVersion, digest

# Any process's settings: each function returns the kind it was given.
S = TypeVar("S", bound=CommonSettings)


@dataclass(frozen=True)
class Entry:
    name: str
    module: str
    root: Path
    # This pipeline's engines and their admin ports; empty: the settings' own
    # (TWINSTREAM_ENGINE_IDS, _ENGINE_ADMIN_PORTS), for one pipeline of the file.
    engines: tuple[str, ...] = ()
    admin_ports: tuple[int, ...] = ()
    # Partitions of the pipeline's topics; None: the settings' (TWINSTREAM_PARTITIONS).
    partitions: int | None = None
    # Publisher adapters `make up` runs for it (twinstream.edge.publisher): {source, count,
    # pattern}; none when absent or count = 0.
    publishers: Publishers | None = None


@dataclass(frozen=True)
class Publishers:
    source: str  # a file, a folder, or http://HOST:PORT
    count: int = 2
    pattern: str = "*.jsonl"


# The keys a pipeline's table may hold (Entry's fields that the file gives).
KEYS = ("module", "partitions", "engines", "admin_ports", "publishers")


def _publishers(path: Path, name: str, given: object) -> Publishers | None:
    if given is None:
        return None
    fix = (
        f'{path}: [{name}] publishers = {{ source = "FILE|FOLDER|http://HOST:PORT", count = 2, '
        'pattern = "*.jsonl" }: '
    )
    if not isinstance(given, dict) or not isinstance(given.get("source"), str):
        raise SettingsError(fix + "a table with a source")
    unknown = sorted(set(given) - {"source", "count", "pattern"})
    if unknown:
        raise SettingsError(fix + f"{unknown[0]!r} is none of its keys")
    if given["source"].strip() == "-":
        # A supervised program's standard input is nobody's pipe: it would end at once.
        raise SettingsError(
            fix + "standard input (-) is a pipe you give the adapters you start yourself "
            "(`... | twinstream publish --source -`), not one `make up` can give them"
        )
    count = given.get("count", 2)
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= 9:
        raise SettingsError(fix + "count is a whole number from 0 (none) to 9")
    if given["source"].strip().startswith("http://") and count > 1:
        # `make up` runs a pipeline's adapters on this one machine: the second could not
        # listen on the first one's port, and supervisord would restart it for ever.
        raise SettingsError(
            fix + f"an HTTP source is one port of one machine, where {count} adapters "
            "cannot all listen: give count = 1 here, and run the others on other machines "
            "(`twinstream publish --pipeline ... --source http://0.0.0.0:PORT --id ...`)"
        )
    pattern = given.get("pattern", "*.jsonl")
    if not isinstance(pattern, str):
        raise SettingsError(fix + "pattern is a glob of a folder's files")
    return Publishers(given["source"], count, pattern) if count else None


def entries(path: Path) -> dict[str, Entry]:
    """The pipelines the file lists, in its order."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SettingsError(
            f"no pipelines file at {path}: set TWINSTREAM_PIPELINES_FILE or write one "
            "(see README, 'Write your own pipeline')"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: not valid TOML: {exc}") from exc
    found: dict[str, Entry] = {}
    for name, table in data.items():
        if not isinstance(table, dict) or not isinstance(table.get("module"), str):
            raise SettingsError(f'{path}: [{name}] needs module = "package.module[:attribute]"')
        unknown = sorted(set(table) - set(KEYS))
        if unknown:
            # A typo (`partition = 3`) would otherwise be lost without a word.
            close = difflib.get_close_matches(unknown[0], KEYS, n=1)
            raise SettingsError(
                f"{path}: [{name}] has {unknown[0]!r}, which is no key of a pipeline"
                + (f" (did you mean {close[0]!r}?)" if close else "")
                + f": a pipeline's table takes {', '.join(KEYS)} (docs/pipelines.md)"
            )
        engines = tuple(str(e) for e in table.get("engines", ()))
        ports = tuple(int(p) for p in table.get("admin_ports", ()))
        if len(engines) != len(ports):
            raise SettingsError(
                f"{path}: [{name}] names {len(engines)} engines and {len(ports)} admin_ports: "
                "one port per engine"
            )
        partitions = table.get("partitions")
        if partitions is not None and (
            not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1
        ):
            raise SettingsError(f"{path}: [{name}] partitions must be a whole number >= 1")
        found[name] = Entry(
            name,
            table["module"],
            path.parent,
            engines,
            ports,
            partitions,
            _publishers(path, name, table.get("publishers")),
        )
    taken: dict[str, str] = {}
    for entry in found.values():
        for engine in entry.engines:
            if engine in taken:
                raise SettingsError(
                    f"{path}: engine {engine!r} is in [{taken[engine]}] and [{entry.name}]: "
                    "engine ids are the stack's, one pipeline each"
                )
            taken[engine] = entry.name
    return found


def settings_for(base: S, name: str) -> S:
    """The settings of pipeline `name` on the stack `base` describes.

    The base's own pipeline keeps the base's topics; another gets `<name>.in`, `.out`,
    `.dlq`, `.progress`. Engines and admin ports come from the pipelines file, else from
    the base (TWINSTREAM_ENGINE_IDS, _ENGINE_ADMIN_PORTS). A pipeline declared by
    TWINSTREAM_PIPELINE_MODULE (outside the file) is the base itself."""
    if base.pipeline_module and name == base.pipeline:
        return base
    return _settings_for(base, name, entries(base.pipelines_file))


def _settings_for(base: S, name: str, listed: dict[str, Entry]) -> S:
    """settings_for with the pipelines file already read (`stack` reads it once)."""
    if name not in listed:
        raise SettingsError(
            f"pipeline {name!r} is not in {base.pipelines_file} "
            f"(it lists {', '.join(listed) or 'none'}): add a [{name}] table or fix the name"
        )
    entry = listed[name]
    update: dict[str, object] = {"pipeline_module": ""}
    if name != base.pipeline:
        update |= {
            "pipeline": name,
            "inbound_topic": f"{name}.in",
            "outbound_topic": f"{name}.out",
            "dlq_topic": f"{name}.dlq",
            "progress_topic": f"{name}.progress",
        }
    if entry.engines:
        update |= {"engine_ids": list(entry.engines), "engine_admin_ports": list(entry.admin_ports)}
    if entry.partitions is not None:
        update |= {"partitions": entry.partitions}
    if entry.publishers is not None:
        update |= {
            "publisher_source": entry.publishers.source,
            "publisher_count": entry.publishers.count,
            "publisher_pattern": entry.publishers.pattern,
        }
    return base.model_copy(update=update)


def stack(base: S) -> dict[str, S]:
    """The pipelines the stack runs, name -> settings, in the file's order: the ones in
    TWINSTREAM_STACK_PIPELINES, or every one in the pipelines file; with
    TWINSTREAM_PIPELINE_MODULE, that one pipeline. Refuses two pipelines sharing an engine
    id or an admin port: each engine is one pipeline's."""
    if base.pipeline_module:
        return {base.pipeline_name: base}
    listed = entries(base.pipelines_file)
    unknown = [n for n in base.stack_pipelines if n not in listed]
    if unknown:
        raise SettingsError(
            f"TWINSTREAM_STACK_PIPELINES names {', '.join(unknown)}, which "
            f"{base.pipelines_file} does not list (it lists {', '.join(listed) or 'none'})"
        )
    chosen = [n for n in listed if not base.stack_pipelines or n in base.stack_pipelines]
    result = {name: _settings_for(base, name, listed) for name in chosen}
    owners: dict[object, str] = {}
    for name, settings in result.items():
        for engine_id, port in zip(settings.engine_ids, settings.engine_admin_ports, strict=True):
            for key, what in ((engine_id, f"engine {engine_id!r}"), (port, f"admin port {port}")):
                if key in owners and owners[key] != name:
                    raise SettingsError(
                        f"{what} belongs to both {owners[key]!r} and {name!r}: give each pipeline "
                        f"its own `engines` and `admin_ports` in {base.pipelines_file}"
                    )
                owners[key] = name
    return result


def for_engine(base: S, engine_id: str) -> S:
    """The settings of the stack pipeline that engine `engine_id` runs."""
    pipelines = stack(base)
    for settings in pipelines.values():
        if engine_id in settings.engine_ids:
            return settings
    known = ", ".join(f"{e} ({n})" for n, s in pipelines.items() for e in s.engine_ids)
    raise SettingsError(f"no pipeline of this stack runs engine {engine_id!r}; engines: {known}")


def engines(base: S) -> list[str]:
    """Every engine of the stack, pipeline by pipeline."""
    return [e for settings in stack(base).values() for e in settings.engine_ids]


def names(pipelines_file: Path) -> list[str]:
    return list(entries(pipelines_file))


def _entry(settings: CommonSettings) -> Entry:
    listed = entries(settings.pipelines_file)
    if settings.pipeline not in listed:
        raise SettingsError(
            f"pipeline {settings.pipeline!r} is not in {settings.pipelines_file} "
            f"(it lists {', '.join(listed) or 'none'})"
        )
    return listed[settings.pipeline]


def module_spec(settings: CommonSettings) -> tuple[str, Path]:
    """The pipeline's `module[:attribute]` and the folder it is found under:
    TWINSTREAM_PIPELINE_MODULE if set, else the pipelines file's entry for its name."""
    if settings.pipeline_module:
        return settings.pipeline_module, settings.pipelines_file.parent
    entry = _entry(settings)
    return entry.module, entry.root


def load(settings: CommonSettings) -> Pipeline:
    """The pipeline these settings run (module_spec). Imports the pipeline's module."""
    # The settings' name is the deployment's (topics, znodes): one declaration may run
    # under several names, as the tests run theirs.
    return load_module(*module_spec(settings))


def module_folder(settings: CommonSettings) -> Path:
    """The folder of the pipeline's module, whose code its version digests (found, not
    imported)."""
    spec, root = module_spec(settings)
    add_to_path(root)
    name = spec.partition(":")[0]
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        found = None
    if found is None or found.origin is None:
        raise SettingsError(
            f"pipeline {settings.pipeline_name}: no module {name!r} under {root} or on the "
            "path: fix `module` in the pipelines file"
        )
    return Path(found.origin).parent


def code_version(settings: CommonSettings, pipeline: Pipeline) -> CodeVersion:
    """The version of the code `pipeline` was loaded from: its declared version and the
    digest of its module's folder as it is now (read right after loading it)."""
    return CodeVersion(pipeline.version, code_digest(settings))


def code_digest(settings: CommonSettings) -> str:
    """The digest of the pipeline's code on disk now ("" if its folder cannot be found)."""
    try:
        return digest(module_folder(settings))
    except (SettingsError, OSError):
        return ""


def pipeline_settings(name: str) -> TaskSettings:
    """Pipeline `name`'s settings on the stack the environment describes (a DAG task's
    view: TWINSTREAM_* plus the pipelines file)."""
    return settings_for(environment.load(TaskSettings), name)


def chosen(base: S, name: str | None = None) -> S:
    """The settings of the one pipeline a command works on: `name`, else the environment's
    (TWINSTREAM_PIPELINE), else the pipelines file's only pipeline. With several and none
    chosen, the error lists them: the product has no default pipeline of its own."""
    name = name or base.pipeline
    if not name and base.pipeline_module:
        raise SettingsError(
            "TWINSTREAM_PIPELINE_MODULE is set but TWINSTREAM_PIPELINE is not: name the "
            "pipeline that module declares"
        )
    if not name:
        listed = entries(base.pipelines_file)
        if len(listed) != 1:
            raise SettingsError(
                f"which pipeline? give --pipeline NAME or set TWINSTREAM_PIPELINE: "
                f"{base.pipelines_file} lists {', '.join(listed) or 'none'}"
            )
        name = next(iter(listed))
    return settings_for(base, name)


def free_engines(base: S, count: int = 2) -> list[tuple[str, int]]:
    """`count` engine ids and admin ports no pipeline of the stack uses (for a new
    pipeline's entry): the first free letters, the ports after the highest in use."""
    pipelines = stack(base)
    used = {e for s in pipelines.values() for e in s.engine_ids}
    ports = [p for s in pipelines.values() for p in s.engine_admin_ports] or [8700]
    ids = [c for c in "abcdefghijklmnopqrstuvwxyz" if c not in used][:count]
    return [(engine_id, max(ports) + 1 + i) for i, engine_id in enumerate(ids)]
