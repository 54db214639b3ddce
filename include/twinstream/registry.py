"""The pipelines file: which pipelines this platform runs, and where their code lives.

    # pipelines.toml
    [hostmetrics]
    module = "examples.hostmetrics.pipeline"   # module[:attribute], attribute `pipeline`

The file's folder goes first on the Python path (and on PYTHONPATH, which Spark's Python
workers inherit), so a module beside it imports as it would in a test. Reading the file
is all that happens at import or DAG-parse time; a pipeline's module is imported only by
`load`, in the process that runs it.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from twinstream.config import Settings, SettingsError
from twinstream.contract import Pipeline
from twinstream.contract import load as load_module


@dataclass(frozen=True)
class Entry:
    name: str
    module: str
    root: Path
    # This pipeline's engines and their admin ports; empty: the settings' own
    # (TWINSTREAM_ENGINE_IDS, _ENGINE_ADMIN_PORTS), for the first pipeline of the file.
    engines: tuple[str, ...] = ()
    admin_ports: tuple[int, ...] = ()


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
        engines = tuple(str(e) for e in table.get("engines", ()))
        ports = tuple(int(p) for p in table.get("admin_ports", ()))
        if len(engines) != len(ports):
            raise SettingsError(
                f"{path}: [{name}] names {len(engines)} engines and {len(ports)} admin_ports: "
                "one port per engine"
            )
        found[name] = Entry(name, table["module"], path.parent, engines, ports)
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


def settings_for(base: Settings, name: str) -> Settings:
    """The settings of pipeline `name` on the stack `base` describes: its topics
    (`<name>.in`, ...), its engines and admin ports from the pipelines file (the base
    settings' own when the file gives none)."""
    listed = entries(base.pipelines_file)
    if name not in listed:
        raise SettingsError(
            f"pipeline {name!r} is not in {base.pipelines_file} "
            f"(it lists {', '.join(listed) or 'none'})"
        )
    entry = listed[name]
    update: dict[str, object] = {
        "pipeline": name,
        "inbound_topic": f"{name}.in",
        "outbound_topic": f"{name}.out",
        "dlq_topic": f"{name}.dlq",
        "progress_topic": f"{name}.progress",
        "pipeline_module": "",
    }
    if entry.engines:
        update |= {"engine_ids": list(entry.engines), "engine_admin_ports": list(entry.admin_ports)}
    return base.model_copy(update=update)


def all_settings(base: Settings) -> dict[str, Settings]:
    """Every listed pipeline's settings, in the file's order."""
    return {name: settings_for(base, name) for name in entries(base.pipelines_file)}


def names(settings: Settings) -> list[str]:
    return list(entries(settings.pipelines_file))


def load(settings: Settings) -> Pipeline:
    """The pipeline these settings run: TWINSTREAM_PIPELINE_MODULE if set, else the
    pipelines file's entry for TWINSTREAM_PIPELINE. Imports the pipeline's module."""
    if settings.pipeline_module:
        spec, root = settings.pipeline_module, settings.pipelines_file.parent
    else:
        listed = entries(settings.pipelines_file)
        if settings.pipeline not in listed:
            raise SettingsError(
                f"pipeline {settings.pipeline!r} is not in {settings.pipelines_file} "
                f"(it lists {', '.join(listed) or 'none'})"
            )
        entry = listed[settings.pipeline]
        spec, root = entry.module, entry.root
    # The settings' name is the deployment's (topics, znodes): one declaration may run
    # under several names, as the tests run theirs.
    return load_module(spec, root)
