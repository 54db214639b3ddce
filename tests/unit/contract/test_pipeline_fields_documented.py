"""Every field of the contract and every key of a pipelines-file entry is where a user
looks for it: docs/pipelines.md's tables, the skeleton `twinstream new-pipeline` writes,
and (the keys) the entry it prints. A field or key added to the code and nowhere else
fails here, by name."""

from __future__ import annotations

import dataclasses
import re
import tomllib

import pytest

from twinstream.contract import Pipeline
from twinstream.ops import skeleton
from twinstream.platform import registry
from twinstream.platform.settings import REPO_ROOT, load_settings

DOC = REPO_ROOT / "docs" / "pipelines.md"
PIPELINE_FIELDS = [f.name for f in dataclasses.fields(Pipeline)]
# An entry's fields but the two that are not keys: its table's name and the file's folder.
TOML_KEYS = [f.name for f in dataclasses.fields(registry.Entry) if f.name not in ("name", "root")]


def test_the_registry_accepts_exactly_the_keys_an_entry_holds():
    # registry.KEYS refuses every other key by name: it must name each field the file gives.
    assert sorted(registry.KEYS) == sorted(TOML_KEYS)


def table(heading: str) -> set[str]:
    """The names in the first column of the doc's table whose header cell is `heading`."""
    lines = DOC.read_text().splitlines()
    names: set[str] = set()
    inside = False
    for line in lines:
        if not line.startswith("|"):
            inside = False
            continue
        first = line.split("|")[1].strip()
        if first == heading:
            inside = True
        elif inside:
            names.update(re.findall(r"`([^`]+)`", first))
    return names


def test_the_keys_are_the_registrys_own():
    # The introspection would pass vacuously if Entry lost its keys.
    assert {"module", "partitions", "engines", "admin_ports"} <= set(TOML_KEYS)


@pytest.mark.parametrize("name", PIPELINE_FIELDS)
def test_every_pipeline_field_is_in_the_docs_table_and_the_skeleton(name: str):
    assert name in table("field"), f"docs/pipelines.md's field table lacks `{name}`"
    assert re.search(rf"\b{name}=", skeleton.PIPELINE), f"the skeleton does not declare {name}="


@pytest.mark.parametrize("key", TOML_KEYS)
def test_every_pipelines_file_key_is_in_the_docs_table_and_the_printed_entry(key: str):
    assert key in table("key"), f"docs/pipelines.md's pipelines-file table lacks `{key}`"
    entry = tomllib.loads(skeleton.pipelines_entry("shop", [("e", 8705), ("f", 8706)]))
    assert key in entry["shop"], f"pipelines_entry does not print {key}"


def test_the_printed_entry_is_one_the_registry_reads_as_printed(tmp_path):
    text = skeleton.pipelines_entry("shop", [("e", 8705), ("f", 8706)])
    # Every key carries a comment saying what it is.
    assert all("  # " in line for line in text.splitlines()[1:])
    path = tmp_path / "pipelines.toml"
    path.write_text(text)
    (entry,) = registry.entries(path).values()
    assert (entry.name, entry.module, entry.partitions) == ("shop", "shop.pipeline", 3)
    assert (entry.engines, entry.admin_ports) == (("e", "f"), (8705, 8706))
    settings = registry.stack(load_settings(pipelines_file=path))["shop"]
    assert settings.engine_admin_url("f") == "http://127.0.0.1:8706"


def test_no_free_engine_is_refused_by_name():
    with pytest.raises(ValueError, match="no free engine ids"):
        skeleton.pipelines_entry("shop", [])
