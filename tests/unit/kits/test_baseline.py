"""The Kafka Streams baseline's status lines and its "active with an in-sync standby" test,
which decide when bench/kafka_streams.py strikes and when a round is over."""

from pathlib import Path

import pytest

from bench.baseline import FLINK, Instance, Status, figure, pair, parse_status
from twinstream.platform.settings import Settings


def status(state: str = "RUNNING", active: str = "", standby: str = "", lag: str = "-") -> str:
    return f"status state={state} active={active} standby={standby} lag={lag}"


def test_a_status_line_is_parsed():
    assert parse_status(status(active="0_0", lag="-")) == Status("RUNNING", ("0_0",), (), None)
    assert parse_status(status(state="REBALANCING", standby="0_0,1_0", lag="42\n")) == Status(
        "REBALANCING", (), ("0_0", "1_0"), 42
    )


@pytest.mark.parametrize(
    "line",
    ["", "Exception in thread main", "status state=RUNNING active=0_0", "status lag=3"],
)
def test_other_lines_are_not_statuses(line):
    assert parse_status(line) is None


def s(line: str) -> Status:
    parsed = parse_status(line)
    assert parsed is not None
    return parsed


def test_a_pair_is_an_active_and_a_running_standby_within_the_lag():
    active = s(status(active="0_0"))
    assert pair({"a": active, "b": s(status(standby="0_0", lag="10"))}, 100) == ("a", "b")
    assert pair({"a": s(status(standby="0_0", lag="100")), "b": active}, 100) == ("b", "a")


@pytest.mark.parametrize(
    "other",
    [
        None,  # not started, or no status line yet
        status(standby="0_0", lag="101"),  # too far behind
        status(standby="0_0", lag="-"),  # lag not known yet
        status(state="REBALANCING", standby="0_0", lag="0"),
        status(),  # running, holding nothing: the standby replica is not placed yet
    ],
)
def test_no_pair_without_an_in_sync_standby(other):
    statuses = {"a": s(status(active="0_0")), "b": None if other is None else s(other)}
    assert pair(statuses, 100) is None


def test_no_pair_while_two_instances_claim_the_task():
    both = s(status(active="0_0", standby="0_0", lag="0"))
    assert pair({"a": both, "b": both}, 100) is None


def test_the_instance_writes_which_process_it_is(tmp_path: Path):
    settings = Settings(kafka_bootstrap="127.0.0.1:1", jars_dir=tmp_path)
    instance = Instance("a", settings, "app", tmp_path)
    instance.starts = 2
    command = instance.command()
    assert command[-6:] == [
        "127.0.0.1:1",
        "app",
        settings.inbound_topic,
        settings.outbound_topic,
        "a.2",
        str(tmp_path / "kafka-streams-a"),
    ]
    assert f"{tmp_path / 'kafka-streams'}/*" in command


def test_starting_without_the_built_app_says_how_to_build_it(tmp_path: Path):
    settings = Settings(kafka_bootstrap="127.0.0.1:1", jars_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="make install"):
        Instance("a", settings, "app", tmp_path).start()


def test_a_figure_leaves_out_rounds_without_it():
    rounds: list[dict[str, float | None]] = [
        {"to_active_s": 40.0},
        {"to_active_s": None},
        {"to_active_s": 50.0},
        {},
    ]
    assert figure(rounds, "to_active_s") == {
        "n": 2,
        "median": 45.0,
        "p99": 50.0,
        "worst": 50.0,
        "all": [40.0, 50.0],
    }
    assert figure(rounds[1:2], "to_active_s") is None


def test_the_flink_job_gets_its_checkpoint_interval_and_a_bigger_heap(tmp_path: Path):
    settings = Settings(kafka_bootstrap="127.0.0.1:1", jars_dir=tmp_path)
    command = Instance("a", settings, "app", tmp_path, FLINK, ["1000"]).command()
    assert command[-2:] == [str(tmp_path / "flink-a"), "1000"]
    assert f"-Xmx{FLINK.heap}" in command
    assert FLINK.main in command


def test_each_baselines_main_class_is_one_java_defines():
    """The benchmarks start the baselines by class name; a rename once pointed them at a
    package that does not exist (io.bench.baseline), and every run failed at start."""
    from pathlib import Path

    from bench.baseline import FLINK, KAFKA_STREAMS

    java = Path(__file__).parents[3] / "java"
    for app in (KAFKA_STREAMS, FLINK):
        source = java / app.folder / "src/main/java" / (app.main.replace(".", "/") + ".java")
        assert source.is_file(), f"{app.main}: no {source}"
