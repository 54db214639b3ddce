"""1 + N for real in the local stack (issue 38): a pipelines.toml entry with three engines,
`engines = ["c", "d", "e"]`, gets three supervised engine programs, three Airflow
connections, three checkpoints, three health probes and three rows in `make up`'s summary
and in `twinstream status`'s view; `up` settles on one active among the three. Nothing in
`make up` assumes a pair: these tests say so for N = 3 (compose: tests/unit/stack/test_compose.py;
the persist DAG's choice of standby: tests/unit/ops/test_pick_standby.py)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from supervisor.options import ServerOptions

from tests.unit.ops.test_overview import ACTIVE, fake_engines, standby
from twinstream.ops.overview import OK, overview
from twinstream.platform import registry
from twinstream.platform.settings import Settings, load_settings
from twinstream.stack import core, health, render
from twinstream.stack.core import StackError
from twinstream.stack.layout import Layout
from twinstream.stack.supervisor import ProcessInfo

THREE = {"c": 8703, "d": 8704, "e": 8705}
PIPELINES_TOML = (
    '[hostmetrics]\nmodule = "m.h"\n\n'
    '[payments]\nmodule = "m.p"\nengines = ["c", "d", "e"]\nadmin_ports = [8703, 8704, 8705]\n'
)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    path = tmp_path / "pipelines.toml"
    path.write_text(PIPELINES_TOML)
    return load_settings(
        state_dir=tmp_path, jars_dir=tmp_path / "jars", pipelines_file=path, admin_token="tok"
    )


def test_the_pipelines_file_gives_a_pipeline_three_engines_with_their_ports(settings):
    payments = registry.stack(settings)["payments"]
    assert payments.engine_ids == list(THREE)
    assert [payments.engine_admin_port(e) for e in THREE] == list(THREE.values())
    assert registry.engines(settings) == ["a", "b", "c", "d", "e"]
    for engine_id in THREE:
        assert registry.for_engine(settings, engine_id).pipeline == "payments"


def test_supervisord_runs_three_engines_of_one_pipeline_each_under_its_id(settings, tmp_path):
    layout = Layout.of(settings)
    for directory in (layout.logs, layout.supervisor_dir):
        directory.mkdir(parents=True, exist_ok=True)
    conf = tmp_path / "supervisord.conf"
    conf.write_text(render.supervisord_conf(settings, layout, "/venv/bin:/usr/bin"))
    options = ServerOptions()
    options.configfile = str(conf)
    options.process_config(do_usage=False)
    programs = {p.name: p for g in options.process_group_configs for p in g.process_configs}
    engines = sorted(n for n in programs if n.startswith("engine-"))
    assert engines == [f"engine-{e}" for e in "abcde"]
    for engine_id in THREE:
        program = programs[f"engine-{engine_id}"]
        assert shlex.split(program.command)[-2:] == ["--engine-id", engine_id]
        # Started by `up` once the topics exist, restarted by supervisord whenever it exits.
        assert program.autostart is False
        assert program.autorestart is not False
        assert program.stdout_logfile == str(layout.log_file(f"engine-{engine_id}"))


def test_each_of_three_engines_finds_its_pipeline_its_port_and_a_checkpoint_of_its_own(
    settings, monkeypatch
):
    """As spark_jobs/engine.py resolves itself from its program's environment."""
    programs = {p.name: p for p in render.programs(settings, Layout.of(settings))}
    checkpoints, folders = set(), set()
    for engine_id, port in THREE.items():
        for key, value in programs[f"engine-{engine_id}"].environment.items():
            monkeypatch.setenv(key, value)
        mine = registry.for_engine(load_settings(), engine_id)
        assert (mine.pipeline, mine.inbound_topic) == ("payments", "payments.in")
        assert mine.engine_admin_url(engine_id) == f"http://127.0.0.1:{port}"
        checkpoints.add(mine.checkpoint_uri(engine_id))
        folders.add(mine.engine_dir(engine_id))
        # On shared storage too: named by pipeline and engine.
        shared = mine.model_copy(update={"checkpoint_root": "s3a://bucket/cp"})
        checkpoints.add(shared.checkpoint_uri(engine_id))
    assert len(checkpoints) == 6
    assert len(folders) == 3


def test_airflow_gets_a_connection_to_each_of_three_engines(settings):
    conns = json.loads(render.airflow_connections(settings))
    assert sorted(conns) == [f"twinstream_engine_{e}" for e in "abcde"]
    for engine_id, port in THREE.items():
        conn = conns[settings.engine_conn_id(engine_id)]
        assert (conn["host"], conn["port"], conn["password"]) == ("127.0.0.1", port, "tok")


def test_up_probes_each_of_three_engines_on_its_own_port(settings, monkeypatch):
    asked = []

    def engine(pipeline: Settings, engine_id: str, timeout_s: float = 3.0):
        asked.append((pipeline.pipeline, engine_id, pipeline.engine_admin_port(engine_id)))
        return True, "standby, pipeline running", "standby"

    monkeypatch.setattr(health, "engine", engine)
    for engine_id in THREE:
        ok, detail = core.probe(settings, f"engine-{engine_id}", None, {})
        assert ok
        assert detail.startswith("payments: ")
    assert asked == [("payments", e, p) for e, p in THREE.items()]


def test_up_settles_on_exactly_one_active_among_three(settings, monkeypatch):
    payments = registry.stack(settings)["payments"]
    roles = {"c": "standby", "d": "active", "e": "standby"}
    monkeypatch.setattr(health, "engine", lambda s, e, timeout_s=3.0: (True, "", roles[e]))
    said: list[str] = []
    assert core.wait_for_one_active(payments, said.append) == "d"
    assert "engine d active" in said[0]
    # Two actives among three is no settled election.
    roles["e"] = "active"
    with pytest.raises(StackError, match="no single active engine of payments"):
        core.wait_for_one_active(payments, said.append, timeout_s=0)


def test_the_summary_names_three_engines_and_where_each_answers(settings):
    processes = [
        ProcessInfo(f"engine-{e}", f"engine-{e}", "RUNNING", 100 + i, "")
        for i, e in enumerate("abcde")
    ]
    text = core.summary(settings, processes)
    assert "pipeline payments: engines c, d, e;" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("engine-")}
    for engine_id, port in THREE.items():
        assert f"payments http://127.0.0.1:{port}/docs" in rows[f"engine-{engine_id}"]


def test_the_standalone_worker_has_a_share_for_each_engine(settings):
    assert render.worker_cores(settings) == settings.spark_cores * 5


def test_twinstream_status_sees_one_active_and_two_standbys_each_covering_a_takeover(settings):
    answers = {
        "a": ACTIVE,
        "b": standby({0: 100, 1: 50}, 0, in_sync=True),
        "c": standby({0: 105, 1: 50}, 5, in_sync=True),
        "d": ACTIVE,
        "e": standby({0: 100, 1: 52}, 2, in_sync=True),
    }
    seen = overview(registry.stack(settings), fake_engines(answers), with_history=False)
    _, payments = seen.pipelines
    assert payments.active == "d"
    assert [(v.engine_id, v.role) for v in payments.engines] == [
        ("c", "standby"),
        ("d", "active"),
        ("e", "standby"),
    ]
    # Each standby is judged against the one active: either may take over.
    c, _, e = payments.engines
    assert (c.takeover_needs, c.covers_takeover, e.takeover_needs, e.covers_takeover) == (
        5,
        True,
        2,
        True,
    )
    assert payments.problems == []
    assert {v.health for v in payments.engines} == {OK}
