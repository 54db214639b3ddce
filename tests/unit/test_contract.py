"""The contract's own checks and the pipelines file, without Spark: a pipeline that breaks
the contract, or a file that names nothing usable, fails by name with the fix."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from twinstream import registry
from twinstream.config import REPO_ROOT, SettingsError, load_settings
from twinstream.contract import ContractError, Pipeline, field_types


def identity(df):
    return df


def test_field_types_read_ddl_without_spark():
    assert field_types(
        "id STRING, n BIGINT NOT NULL, tags ARRAY<STRING>, m MAP<STRING, INT>, d DECIMAL(10,2)"
    ) == {
        "id": "string",
        "n": "bigint",
        "tags": "array<string>",
        "m": "map<string, int>",
        "d": "decimal(10,2)",
    }


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"value": []}, "value names no column"),
        ({"value": ["a", "b"], "value_format": "text"}, "publishes one column as it is"),
        ({"value": ["msg_id"]}, r"\['msg_id'\] are the framework's columns"),
        ({"key": "dead_letter"}, r"\['dead_letter'\] are the framework's columns"),
        ({"expectations": list}, "expectations need value_schema"),
    ],
)
def test_a_pipeline_that_breaks_the_contract_is_refused_by_name(changes, message):
    fields = {"name": "p", "schema": "a STRING", "transform": identity, "key": "a", "value": ["a"]}
    with pytest.raises(ContractError, match=message):
        Pipeline(**{**fields, **changes})


@pytest.fixture(autouse=True)
def own_path(monkeypatch):
    """Loading a pipeline puts the pipelines file's folder on sys.path and PYTHONPATH:
    each test gets both back as they were."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))


def write(folder: Path, text: str) -> Path:
    path = folder / "pipelines.toml"
    path.write_text(text)
    return path


def test_the_pipelines_file_lists_modules_and_loads_the_named_one(tmp_path, monkeypatch):
    package = tmp_path / "mine"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "flow.py").write_text(
        "from twinstream.contract import Pipeline\n"
        "pipeline = Pipeline(name='flow', schema='a STRING', transform=lambda df: df,"
        " key='a', value=['a'])\n"
        "other = 3\n"
    )
    path = write(tmp_path, '[flow]\nmodule = "mine.flow"\n\n[odd]\nmodule = "mine.flow:other"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    settings = load_settings(pipelines_file=path, pipeline="flow")
    assert registry.names(settings) == ["flow", "odd"]
    assert registry.load(settings).name == "flow"
    with pytest.raises(ContractError, match=r"mine\.flow has no Pipeline named 'other'"):
        registry.load(load_settings(pipelines_file=path, pipeline="odd"))
    with pytest.raises(SettingsError, match=r"'nope' is not in .* \(it lists flow, odd\)"):
        registry.load(load_settings(pipelines_file=path, pipeline="nope"))


def test_a_bad_pipelines_file_says_what_to_write(tmp_path):
    missing = load_settings(pipelines_file=tmp_path / "none.toml")
    with pytest.raises(SettingsError, match=r"no pipelines file .* TWINSTREAM_PIPELINES_FILE"):
        registry.load(missing)
    broken = load_settings(pipelines_file=write(tmp_path, "[flow]\nmodule = 3\n"))
    with pytest.raises(SettingsError, match=r'\[flow\] needs module = "package.module'):
        registry.names(broken)
    unimportable = load_settings(
        pipelines_file=write(tmp_path, '[hostmetrics]\nmodule = "no.such.module"\n')
    )
    with pytest.raises(ContractError, match=r"cannot import pipeline module 'no\.such\.module'"):
        registry.load(unimportable)


def test_the_repositorys_pipelines_file_lists_both_examples_on_three_partitions(monkeypatch):
    assert registry.names(load_settings()) == ["hostmetrics", "payments"]
    assert {s.partitions for s in registry.stack(load_settings()).values()} == {3}
    # The environment's own pipeline as the stack runs it: its entry's partitions, not the
    # environment's default (a tool driving the stack's hostmetrics must see three).
    monkeypatch.delenv("TWINSTREAM_PARTITIONS", raising=False)
    assert load_settings().partitions == 1
    assert registry.configured().partitions == 3


def test_each_pipeline_gets_its_topics_engines_and_ports(tmp_path):
    path = write(
        tmp_path,
        '[one]\nmodule = "m.one"\n\n'
        '[two]\nmodule = "m.two"\nengines = ["c", "d"]\nadmin_ports = [8703, 8704]\n',
    )
    stack = registry.stack(load_settings(pipelines_file=path))
    one, two = stack["one"], stack["two"]
    assert (one.inbound_topic, one.engine_ids, one.engine_admin_ports) == (
        "one.in",
        ["a", "b"],
        [8701, 8702],
    )
    assert (two.progress_topic, two.engine_ids, two.engine_admin_url("c")) == (
        "two.progress",
        ["c", "d"],
        "http://127.0.0.1:8703",
    )
    assert two.election_path == "/twinstream/two/election"
    assert two.transactional_id == "twinstream-two"


def test_engines_belong_to_one_pipeline_and_have_one_port_each(tmp_path):
    twice = write(
        tmp_path,
        '[one]\nmodule = "m"\nengines = ["a"]\nadmin_ports = [1]\n\n'
        '[two]\nmodule = "m"\nengines = ["a"]\nadmin_ports = [2]\n',
    )
    with pytest.raises(SettingsError, match=r"engine 'a' is in \[one\] and \[two\]"):
        registry.entries(twice)
    short = write(tmp_path, '[one]\nmodule = "m"\nengines = ["a", "b"]\nadmin_ports = [1]\n')
    with pytest.raises(SettingsError, match="2 engines and 1 admin_ports"):
        registry.entries(short)


TWO = (
    '[one]\nmodule = "m.one"\n\n'
    '[two]\nmodule = "m.two"\nengines = ["c", "d"]\nadmin_ports = [8703, 8704]\n'
)


def test_the_stack_runs_the_chosen_pipelines_and_knows_each_engines_pipeline(tmp_path):
    path = write(tmp_path, TWO)
    base = load_settings(pipelines_file=path, pipeline="one")
    assert list(registry.stack(base)) == ["one", "two"]
    assert registry.engines(base) == ["a", "b", "c", "d"]
    assert registry.for_engine(base, "d").pipeline == "two"
    assert registry.for_engine(base, "a").inbound_topic == "one.in"
    with pytest.raises(SettingsError, match=r"no pipeline of this stack runs engine 'x'.*\(two\)"):
        registry.for_engine(base, "x")
    only = load_settings(pipelines_file=path, stack_pipelines="two")
    assert list(registry.stack(only)) == ["two"]
    with pytest.raises(SettingsError, match="names three, which"):
        registry.stack(load_settings(pipelines_file=path, stack_pipelines="two,three"))


def test_the_base_pipeline_keeps_its_topics_and_a_module_pipeline_is_the_whole_stack(tmp_path):
    path = write(tmp_path, TWO)
    base = load_settings(pipelines_file=path, pipeline="one", inbound_topic="custom.in")
    assert registry.stack(base)["one"].inbound_topic == "custom.in"
    assert registry.stack(base)["two"].inbound_topic == "two.in"
    own = load_settings(pipelines_file=path, pipeline="mine", pipeline_module="tests.x")
    assert registry.stack(own) == {"mine": own}


def test_two_pipelines_may_not_share_an_engine_or_a_port(tmp_path):
    clash = write(
        tmp_path,
        '[one]\nmodule = "m"\n\n[two]\nmodule = "m"\nengines = ["c"]\nadmin_ports = [8701]\n',
    )
    with pytest.raises(SettingsError, match="admin port 8701 belongs to both 'one' and 'two'"):
        registry.stack(load_settings(pipelines_file=clash))
    same = write(tmp_path, '[one]\nmodule = "m"\n\n[two]\nmodule = "m"\n')
    with pytest.raises(SettingsError, match="engine 'a' belongs to both"):
        registry.stack(load_settings(pipelines_file=same))


def test_new_pipeline_offers_engines_and_ports_no_pipeline_uses(tmp_path, capsys):
    from twinstream import cli

    assert registry.free_engines(load_settings()) == [("e", 8705), ("f", 8706)]
    assert cli.main(["new-pipeline", "shop_totals", "--dir", str(tmp_path)]) == 0
    hint = capsys.readouterr().out
    assert '[shop_totals]\nmodule = "shop_totals.pipeline"\nengines = ["e", "f"]' in hint
    assert "admin_ports = [8705, 8706]" in hint
    # What it offers is what the pipelines file then accepts beside the examples.
    repo = (REPO_ROOT / "pipelines.toml").read_text()
    path = write(tmp_path, repo + hint[hint.index("[shop_totals]") : hint.index("\n\nand")])
    assert registry.engines(load_settings(pipelines_file=path))[-2:] == ["e", "f"]
