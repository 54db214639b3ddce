"""A pipeline's `publishers` entry: `make up` runs that many publisher adapters under
supervisord, started with the engines (twinstream.platform.registry,
twinstream.stack.render)."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinstream.platform import registry
from twinstream.platform.settings import Settings, SettingsError, load_settings
from twinstream.stack import render
from twinstream.stack.layout import Layout

FILE = """
[shop]
module = "shop.pipeline"
engines = ["e", "f"]
admin_ports = [8705, 8706]
{publishers}
"""


def _stack(tmp_path: Path, publishers: str) -> dict[str, Settings]:
    path = tmp_path / "pipelines.toml"
    path.write_text(FILE.format(publishers=publishers))
    return dict(registry.stack(load_settings(pipelines_file=path, state_dir=tmp_path)))


def test_the_entry_gives_the_programs_their_source_pattern_and_ids(tmp_path):
    stack = _stack(tmp_path, 'publishers = { source = "/data/in", count = 2, pattern = "*.csv" }')
    settings = load_settings(pipelines_file=tmp_path / "pipelines.toml", state_dir=tmp_path)
    programs = {
        p.name: p
        for p in render.programs(settings, Layout.of(settings), pipelines=stack)
        if p.name.startswith("publisher-")
    }
    assert sorted(programs) == ["publisher-shop-1", "publisher-shop-2"]
    command = programs["publisher-shop-2"].command
    assert command[command.index("--source") + 1] == "/data/in"
    assert command[command.index("--pattern") + 1] == "*.csv"
    assert command[command.index("--id") + 1] == "shop-2"
    assert command[command.index("--pipeline") + 1] == "shop"
    assert not programs["publisher-shop-1"].autostart  # up starts them with the engines


def test_no_entry_or_count_0_runs_none(tmp_path):
    for publishers in ("", 'publishers = { source = "/data/in", count = 0 }'):
        (settings,) = _stack(tmp_path, publishers).values()
        assert render.publisher_programs(settings) == []


@pytest.mark.parametrize(
    ("publishers", "said"),
    [
        ('publishers = "in.jsonl"', "a table with a source"),
        ('publishers = { source = "in", count = 10 }', "count is a whole number from 0"),
        ('publishers = { source = "in", cuont = 2 }', "'cuont' is none of its keys"),
        (
            'publishers = { source = "http://0.0.0.0:8800", count = 2 }',
            "2 adapters cannot all listen: give count = 1",
        ),
    ],
)
def test_a_wrong_entry_is_refused_with_its_form(tmp_path, publishers, said):
    with pytest.raises(SettingsError, match=said):
        _stack(tmp_path, publishers)
