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
        found[name] = Entry(name, table["module"], path.parent)
    return found


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
