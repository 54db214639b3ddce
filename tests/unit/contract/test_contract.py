"""The contract's own checks and the pipelines file, without Spark: a pipeline that breaks
the contract, or a file that names nothing usable, fails by name with the fix."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from twinstream.contract import Bound, ContractError, Pipeline, field_types
from twinstream.platform import registry
from twinstream.platform.settings import REPO_ROOT, SettingsError, load_settings


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
    assert registry.names(settings.pipelines_file) == ["flow", "odd"]
    assert registry.load(settings).name == "flow"
    with pytest.raises(ContractError, match=r"mine\.flow has no Pipeline named 'other'"):
        registry.load(load_settings(pipelines_file=path, pipeline="odd"))
    with pytest.raises(SettingsError, match=r"'nope' is not in .* \(it lists flow, odd\)"):
        registry.load(load_settings(pipelines_file=path, pipeline="nope"))


def test_a_bad_pipelines_file_says_what_to_write(tmp_path):
    missing = load_settings(pipeline="hostmetrics", pipelines_file=tmp_path / "none.toml")
    with pytest.raises(SettingsError, match=r"no pipelines file .* TWINSTREAM_PIPELINES_FILE"):
        registry.load(missing)
    broken = load_settings(
        pipeline="hostmetrics", pipelines_file=write(tmp_path, "[flow]\nmodule = 3\n")
    )
    with pytest.raises(SettingsError, match=r'\[flow\] needs module = "package.module'):
        registry.names(broken.pipelines_file)
    # A typo is named, with the key meant, not silently dropped (partitions stayed 1).
    typo = load_settings(
        pipeline="hostmetrics",
        pipelines_file=write(tmp_path, '[flow]\nmodule = "a.b"\npartition = 3\n'),
    )
    with pytest.raises(SettingsError, match=r"\[flow\] has 'partition'.*did you mean 'partitions'"):
        registry.names(typo.pipelines_file)
    unimportable = load_settings(
        pipeline="hostmetrics",
        pipelines_file=write(tmp_path, '[hostmetrics]\nmodule = "no.such.module"\n'),
    )
    with pytest.raises(ContractError, match=r"cannot import pipeline module 'no\.such\.module'"):
        registry.load(unimportable)


def test_the_repositorys_pipelines_file_lists_both_examples_on_three_partitions(monkeypatch):
    assert registry.names(load_settings().pipelines_file) == ["hostmetrics", "payments"]
    assert {
        s.partitions for s in registry.stack(load_settings(pipeline="hostmetrics")).values()
    } == {3}
    # The environment's own pipeline as the stack runs it: its entry's partitions, not the
    # environment's default (a tool driving the stack's hostmetrics must see three).
    monkeypatch.delenv("TWINSTREAM_PARTITIONS", raising=False)
    assert load_settings(pipeline="hostmetrics").partitions == 1
    assert registry.chosen(load_settings(pipeline="hostmetrics")).partitions == 3


def test_a_command_on_one_pipeline_takes_the_chosen_one_or_the_files_only_one(tmp_path):
    """The product has no default pipeline: with several listed and none chosen, the error
    names them and the fix."""
    two = load_settings(
        pipelines_file=write(tmp_path, '[one]\nmodule = "m.one"\n\n[two]\nmodule = "m.two"\n')
    )
    assert two.pipeline == ""
    with pytest.raises(SettingsError, match=r"give --pipeline NAME .* lists one, two"):
        registry.chosen(two)
    assert registry.chosen(two, "two").inbound_topic == "two.in"
    assert registry.chosen(two.model_copy(update={"pipeline": "one"})).pipeline == "one"
    (tmp_path / "only").mkdir()
    only = load_settings(pipelines_file=write(tmp_path / "only", '[solo]\nmodule = "m.solo"\n'))
    assert registry.chosen(only).topics().outbound == "solo.out"
    with pytest.raises(SettingsError, match="no pipeline chosen"):
        two.topics()


def test_each_pipeline_gets_its_topics_engines_and_ports(tmp_path):
    path = write(
        tmp_path,
        '[one]\nmodule = "m.one"\n\n'
        '[two]\nmodule = "m.two"\nengines = ["c", "d"]\nadmin_ports = [8703, 8704]\n',
    )
    stack = registry.stack(load_settings(pipeline="hostmetrics", pipelines_file=path))
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
    only = load_settings(pipeline="hostmetrics", pipelines_file=path, stack_pipelines="two")
    assert list(registry.stack(only)) == ["two"]
    with pytest.raises(SettingsError, match="names three, which"):
        registry.stack(
            load_settings(pipeline="hostmetrics", pipelines_file=path, stack_pipelines="two,three")
        )


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
        registry.stack(load_settings(pipeline="hostmetrics", pipelines_file=clash))
    same = write(tmp_path, '[one]\nmodule = "m"\n\n[two]\nmodule = "m"\n')
    with pytest.raises(SettingsError, match="engine 'a' belongs to both"):
        registry.stack(load_settings(pipeline="hostmetrics", pipelines_file=same))


def test_new_pipeline_offers_engines_and_ports_no_pipeline_uses(tmp_path, capsys):
    from twinstream.ops import cli

    assert registry.free_engines(load_settings(pipeline="hostmetrics")) == [
        ("e", 8705),
        ("f", 8706),
    ]
    assert cli.main(["new-pipeline", "shop_totals", "--dir", str(tmp_path)]) == 0
    hint = capsys.readouterr().out
    from twinstream.ops.skeleton import pipelines_entry

    # The entry as skeleton.pipelines_entry writes it (its keys held to the registry's by
    # tests/unit/contract/test_pipeline_fields_documented.py), with the engines and ports no
    # pipeline uses.
    assert pipelines_entry("shop_totals", [("e", 8705), ("f", 8706)]).rstrip() in hint
    # What it offers is what the pipelines file then accepts beside the examples.
    repo = (REPO_ROOT / "pipelines.toml").read_text()
    path = write(tmp_path, repo + hint[hint.index("[shop_totals]") : hint.index("\n\nand")])
    assert registry.engines(load_settings(pipeline="hostmetrics", pipelines_file=path))[-2:] == [
        "e",
        "f",
    ]


# Optional members and bounds: refused by name when they name nothing the schema declares.

FIELDS: dict[str, Any] = {
    "name": "p",
    "schema": "kind STRING, amount DOUBLE, n BIGINT NOT NULL",
    "transform": identity,
    "key": "kind",
    "value": ["kind"],
}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"optional": ("amount", "price")},
            r"optional names 'price', which the schema does not declare \(it declares kind, "
            r"amount, n\): add it to the schema or fix the name",
        ),
        ({"optional": "amount"}, r"not the string 'amount': write optional=\('amount',\)"),
        ({"optional": ("n",)}, r"'n' is optional and declared NOT NULL in the schema"),
        ({"partition_by": "card"}, "partition_by names 'card', which the schema does not"),
        (
            {"partition_by": "amount", "optional": ("amount",)},
            "partition_by 'amount' is optional, but a record without it has no key",
        ),
        ({"bounds": {"price": Bound(min=0)}}, "bounds names 'price', which the schema"),
        ({"bounds": {"kind": Bound(min=0)}}, r"bounds\['kind'\]: kind is string, and only a"),
        ({"bounds": {"amount": (0, 1)}}, r"bounds\['amount'\] is \(0, 1\): declare a"),
        (
            {
                "bounds": {"amount": Bound(min=0)},
                "checks": {"out_of_range: amount is below 0": "amount >= 0"},
            },
            "checks repeat the bounds' reasons",
        ),
    ],
)
def test_optional_bounds_and_partition_by_name_declared_members(changes, message):
    with pytest.raises(ContractError, match=message):
        Pipeline(**{**FIELDS, **changes})


def test_a_struct_type_schema_is_read_for_members_too():
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    schema = StructType(
        [StructField("kind", StringType()), StructField("amount", DoubleType(), nullable=False)]
    )
    assert Pipeline(**{**FIELDS, "schema": schema, "optional": ("kind",)}).optional == ("kind",)
    with pytest.raises(ContractError, match="'amount' is optional and declared NOT NULL"):
        Pipeline(**{**FIELDS, "schema": schema, "optional": ("amount",)})
    assert field_types("struct<a: INT, b: STRING NOT NULL>") == {"a": "int", "b": "string"}


@pytest.mark.parametrize(
    ("bound", "message"),
    [
        ({}, "needs min, max or both"),
        ({"min": 2, "max": 1}, "min 2 is above its max 1"),
        ({"min": float("nan")}, "finite numbers, not nan"),
        ({"max": float("inf")}, "finite numbers, not inf"),
        ({"min": True}, "finite numbers, not True"),
    ],
)
def test_a_bound_that_bounds_nothing_is_refused(bound, message):
    with pytest.raises(ContractError, match=message):
        Bound(**bound)


def test_bounds_are_the_guards_rules_first_then_the_checks():
    fields: dict[str, Any] = {
        **FIELDS,
        "bounds": {
            "amount": Bound(min=0, max=1e6, strict_min=True),
            "n": Bound(min=-5, strict_max=True, max=10),
        },
        "checks": {"wrong_type: kind is empty": "kind <> ''"},
    }
    pipeline = Pipeline(**fields)
    assert pipeline.rules() == {
        "out_of_range: amount is not above 0": "`amount` IS NULL OR `amount` > 0",
        "out_of_range: amount is above 1000000.0": "`amount` IS NULL OR `amount` <= 1000000.0",
        "out_of_range: n is below -5": "`n` IS NULL OR `n` >= -5",
        "out_of_range: n is not below 10": "`n` IS NULL OR `n` < 10",
        "wrong_type: kind is empty": "kind <> ''",
    }
    assert list(pipeline.rules())[-1] == "wrong_type: kind is empty"


def test_a_bound_gives_the_expectation_it_implies():
    cpu = Bound(min=0, max=100)
    mean = cpu.expectation("cpu_avg")
    assert (mean.column, mean.min_value, mean.max_value) == ("cpu_avg", 0, 100)
    # A sum of values >= 0 is >= 0, and no max carries over.
    total = cpu.expectation("cpu_sum", of="sum")
    assert (total.min_value, total.max_value, total.strict_max) == (0, None, False)
    positive = Bound(min=0, strict_min=True).expectation("amount")
    assert (positive.min_value, positive.strict_min) == (0, True)
    negative = Bound(min=-10, max=-1).expectation("loss", of="sum")
    assert (negative.min_value, negative.max_value) == (None, -1)
    with pytest.raises(ContractError, match=r"a sum of values within .* has no bound"):
        Bound(min=-1, max=1).expectation("drift", of="sum")
    with pytest.raises(ContractError, match="of='mean'; want 'value' or 'sum'"):
        cpu.expectation("cpu_avg", of="mean")  # type: ignore[arg-type]


def test_the_examples_declare_their_ranges_once():
    """hostmetrics' audit expects of mem_used_sum20 what its guard enforces on mem_used_mb:
    one Bound, used by both (tests/integration/test_contract.py runs them)."""
    from pipelines.hostmetrics import pipeline as hostmetrics
    from pipelines.payments import pipeline as payments

    assert hostmetrics.pipeline.bounds["mem_used_mb"] == Bound(min=0)
    assert "out_of_range: mem_used_mb is below 0" in hostmetrics.pipeline.rules()
    assert hostmetrics.pipeline.expectations is not None
    by_column = {
        e.column: e for e in hostmetrics.pipeline.expectations() if hasattr(e, "min_value")
    }
    assert by_column["mem_used_sum20"].min_value == 0
    assert by_column["cpu_user_avg20"].min_value == 0
    assert "out_of_range: amount is not above 0" in payments.pipeline.rules()


def test_new_pipeline_writes_beside_the_others_by_default_and_the_registry_loads_it(
    tmp_path, capsys, monkeypatch
):
    """Without --dir the skeleton goes to pipelines/ beside the pipelines file, and the entry
    it prints names it there: the registry loads it as written, with nothing on PYTHONPATH."""
    from twinstream.ops import cli

    pipelines_file = write(tmp_path, (REPO_ROOT / "pipelines.toml").read_text())
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "__init__.py").write_text("")
    monkeypatch.setenv("TWINSTREAM_PIPELINES_FILE", str(pipelines_file))
    monkeypatch.delitem(sys.modules, "pipelines", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert cli.main(["new-pipeline", "shop_totals"]) == 0
    hint = capsys.readouterr().out
    assert (tmp_path / "pipelines" / "shop_totals" / "pipeline.py").is_file()
    assert 'module = "pipelines.shop_totals.pipeline"' in hint
    pipelines_file.write_text(
        pipelines_file.read_text() + hint[hint.index("[shop_totals]") : hint.index("\n\nand")]
    )
    settings = load_settings(pipelines_file=pipelines_file, pipeline="shop_totals")
    for name in [m for m in sys.modules if m == "pipelines" or m.startswith("pipelines.")]:
        monkeypatch.delitem(sys.modules, name)
    assert registry.load(settings).name == "shop_totals"
