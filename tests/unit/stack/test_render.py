import os
import re
import shlex

import pytest
from supervisor.options import ServerOptions

from twinstream.platform.settings import load_settings
from twinstream.stack import render
from twinstream.stack.layout import Layout


def _settings(tmp_path, **overrides):
    return load_settings(
        pipeline="hostmetrics", state_dir=tmp_path, jars_dir=tmp_path / "jars", **overrides
    )


def _props(text):
    return dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )


def _parse_supervisord_conf(tmp_path, s, path="/venv/bin:/usr/bin"):
    layout = Layout.of(s)
    for directory in (layout.logs, layout.supervisor_dir):
        directory.mkdir(parents=True, exist_ok=True)
    conf = tmp_path / "supervisord.conf"
    conf.write_text(render.supervisord_conf(s, layout, path))
    options = ServerOptions()
    options.configfile = str(conf)
    options.process_config(do_usage=False)
    return options


def test_zookeeper_uses_tick_500_on_loopback_without_admin_server(tmp_path):
    s = _settings(tmp_path)
    cfg = _props(render.zoo_cfg(s, Layout.of(s)))
    assert cfg["tickTime"] == "500"
    assert cfg["clientPort"] == "2181"
    assert cfg["clientPortAddress"] == "127.0.0.1"
    assert cfg["admin.enableServer"] == "false"
    assert {"ruok", "srvr"} <= set(cfg["4lw.commands.whitelist"].split(","))


def test_zookeeper_refuses_every_client_that_has_not_authenticated_by_sasl(tmp_path):
    s = _settings(tmp_path, zk_password="pw-1_x", zk_user="engines")
    layout = Layout.of(s)
    cfg = _props(render.zoo_cfg(s, layout))
    assert cfg["enforce.auth.enabled"] == "true"
    assert cfg["enforce.auth.schemes"] == "sasl"
    assert cfg["authProvider.sasl"].endswith(".SASLAuthenticationProvider")
    jaas = render.zookeeper_jaas(s)
    assert 'user_engines="pw-1_x";' in jaas
    assert "DigestLoginModule required" in jaas
    (zk,) = [p for p in render.programs(s, layout, pipelines={}) if p.name == "zookeeper"]
    assert f"-Djava.security.auth.login.config={render.zookeeper_jaas_path(layout)}" in (zk.command)
    with pytest.raises(ValueError, match="TWINSTREAM_ZK_PASSWORD"):
        render.zookeeper_jaas(_settings(tmp_path, zk_password='a"b'))


def test_an_ensemble_of_three_zookeepers_knows_its_members(tmp_path):
    s = _settings(tmp_path, zk_nodes=3)
    layout = Layout.of(s)
    cfg = _props(render.zoo_cfg(s, layout, 2))
    assert cfg["clientPort"] == "2182"
    assert cfg["dataDir"] == str(tmp_path / "zookeeper" / "node-2" / "data")
    assert [cfg[f"server.{n}"] for n in (1, 2, 3)] == [
        "127.0.0.1:2888:3888",
        "127.0.0.1:2889:3889",
        "127.0.0.1:2890:3890",
    ]
    options = _parse_supervisord_conf(tmp_path, s)
    programs = {p.name: p for g in options.process_group_configs for p in g.process_configs}
    assert {"zookeeper-1", "zookeeper-2", "zookeeper-3"} <= set(programs)
    assert "zookeeper" not in programs
    argv = shlex.split(programs["zookeeper-3"].command)
    assert argv[-1] == str(tmp_path / "zookeeper" / "node-3" / "zoo.cfg")
    # A single server has no server.N lines and keeps the folder it always had.
    alone = _props(render.zoo_cfg(_settings(tmp_path), layout))
    assert not any(k.startswith("server.") for k in alone)
    assert alone["dataDir"] == str(tmp_path / "zookeeper" / "data")


def test_a_spark_standalone_master_and_worker_run_from_pysparks_distribution(tmp_path):
    s = _settings(tmp_path, spark_standalone=True)
    options = _parse_supervisord_conf(tmp_path, s)
    programs = {p.name: p for g in options.process_group_configs for p in g.process_configs}
    master = shlex.split(programs["spark-master"].command)
    worker = shlex.split(programs["spark-worker"].command)
    assert master[master.index("-cp") + 1] == f"{render.spark_home() / 'jars'}/*"
    assert master[-6:] == ["--host", "127.0.0.1", "--port", "7077", "--webui-port", "8090"]
    assert worker[worker.index(render.SPARK_WORKER_MAIN) + 1] == "spark://127.0.0.1:7077"
    # Every engine of the stack (a-d) gets its core, whatever the machine has.
    assert worker[worker.index("--cores") + 1] == "4"
    assert worker[worker.index("--memory") + 1] == "4g"  # an executor of 1g each
    # The worker builds its executors' command from SPARK_HOME.
    assert programs["spark-worker"].environment["SPARK_HOME"] == str(render.spark_home())
    assert programs["spark-worker"].environment["SPARK_SCALA_VERSION"] == "2.13"
    assert programs["engine-a"].environment["TWINSTREAM_SPARK_STANDALONE"] == "True"
    # No warm spares on a cluster: each would be an application holding an engine's cores.
    assert render.SPARES_PROGRAM not in programs
    assert "spark-master" not in {
        p.name for p in render.programs(_settings(tmp_path), Layout.of(s), pipelines={})
    }


def test_kafka_node_is_a_kraft_broker_and_controller_with_durable_defaults(tmp_path):
    s = _settings(tmp_path)
    props = _props(render.kafka_server_properties(s, Layout.of(s), 2))
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == (
        "1@127.0.0.1:9192,2@127.0.0.1:9193,3@127.0.0.1:9194"
    )
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9093,CONTROLLER://127.0.0.1:9193"
    assert props["log.dirs"] == str(tmp_path / "kafka" / "node-2" / "data")
    assert props["min.insync.replicas"] == "2"
    assert props["transaction.state.log.replication.factor"] == "3"
    assert props["transaction.state.log.min.isr"] == "2"
    assert props["unclean.leader.election.enable"] == "false"
    assert props["auto.create.topics.enable"] == "false"


def test_a_secure_kafka_node_takes_scram_over_tls_and_denies_what_no_acl_allows(tmp_path):
    s = _settings(tmp_path, kafka_security=True)
    layout = Layout.of(s)
    props = _props(render.kafka_server_properties(s, layout, 2))
    assert props["listeners"] == (
        "SASL_SSL://127.0.0.1:9093,BROKER://127.0.0.1:9293,CONTROLLER://127.0.0.1:9193"
    )
    assert props["advertised.listeners"] == "SASL_SSL://127.0.0.1:9093,BROKER://127.0.0.1:9293"
    assert props["listener.security.protocol.map"] == (
        "SASL_SSL:SASL_SSL,BROKER:SSL,CONTROLLER:SSL"
    )
    # The brokers replicate as the servers' certificate: no SCRAM user needed to start.
    assert props["inter.broker.listener.name"] == "BROKER"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["listener.name.broker.ssl.client.auth"] == "required"
    assert props["listener.name.controller.ssl.client.auth"] == "required"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["authorizer.class.name"].endswith(".StandardAuthorizer")
    assert set(props["super.users"].split(";")) == {
        "User:twinstream-admin",
        "User:CN=twinstream-server",
    }
    # No password anywhere in the file, nor in the storage's format command.
    assert not [v for v in props.values() if "password" in v]
    assert props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"].endswith(" required;")
    assert props["ssl.keystore.type"] == "PEM"
    assert props["ssl.truststore.location"] == str(s.tls_dir / "ca.pem")
    assert "--add-scram" not in render.kafka_format_command(s, layout, 2, "x" * 22)
    assert 9293 in s.ports
    assert 9293 not in _settings(tmp_path).ports  # without security, no such listener
    (engine,) = [p for p in render.programs(s, layout) if p.name == "engine-a"]
    assert engine.environment["TWINSTREAM_KAFKA_ROLE"] == "engine"


def test_secure_clients_log_in_as_their_role_and_trust_the_stacks_ca(tmp_path):
    from twinstream.platform.kafka import connection
    from twinstream.platform.kafka_auth import Credentials, users

    s = _settings(tmp_path, kafka_security=True, kafka_role="publisher")
    creds, _ = Credentials.ensure(s.kafka_credentials_path, users(["hostmetrics"]))
    config = connection(s).librdkafka()
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.mechanism"] == "SCRAM-SHA-512"
    assert config["sasl.username"] == "hostmetrics-publisher"
    assert config["sasl.password"] == creds.password("hostmetrics-publisher")
    assert config["ssl.ca.location"] == str(s.tls_dir / "ca.pem")
    spark = connection(s.model_copy(update={"kafka_role": "engine"})).spark_options()
    assert spark["kafka.security.protocol"] == "SASL_SSL"
    assert 'username="hostmetrics-engine"' in spark["kafka.sasl.jaas.config"]
    assert spark["kafka.ssl.truststore.type"] == "PEM"
    assert "sasl.username" not in connection(_settings(tmp_path)).librdkafka()  # security off


def test_cluster_id_is_22_url_safe_characters_never_starting_with_a_dash():
    # One id in 64 would start with "-" if drawn freely: 2,000 draws all but prove the rule.
    ids = {render.new_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", i) for i in ids)


def test_settings_round_trip_through_the_environment(tmp_path, monkeypatch):
    s = _settings(tmp_path, kafka_ports=[1001, 1002, 1003], inbound_retention_ms=123456)
    for key, value in render.settings_environment(s).items():
        monkeypatch.setenv(key, value)
    assert load_settings(pipeline="hostmetrics") == s


def test_supervisord_conf_parses_and_supervises_every_service(tmp_path):
    options = _parse_supervisord_conf(tmp_path, _settings(tmp_path))
    groups = {g.name: g for g in options.process_group_configs}
    # `make up` runs both examples: hostmetrics on a, b; payments on c, d.
    assert set(groups) == {
        "zookeeper",
        "kafka",
        "airflow",
        *(f"engine-{e}" for e in "abcd"),
        "spares",
    }
    programs = {p.name: p for g in groups.values() for p in g.process_configs}
    assert set(programs) == {
        "zookeeper",
        "kafka-1",
        "kafka-2",
        "kafka-3",
        "airflow",
        "engine-a",
        "engine-b",
        "engine-c",
        "engine-d",
        "spares",  # the keeper of the machine's warm spares (TWINSTREAM_SPARES: 1)
    }
    assert programs["engine-c"].command.split()[-2:] == ["--engine-id", "c"]
    keeper = programs["spares"]
    assert keeper.command.split()[-2:] == ["--keep-spares", "1"]
    # Started by `up` with the engines; its spares run with the engines' environment.
    assert not keeper.autostart
    assert keeper.environment == programs["engine-a"].environment
    for program in programs.values():
        assert program.autorestart is not False
        assert program.stopasgroup
        assert program.killasgroup
        assert program.environment["TWINSTREAM_STATE_DIR"] == str(tmp_path)
    assert programs["kafka-3"].environment["TWINSTREAM_KAFKA_PORTS"] == "9092,9093,9094"
    argv = shlex.split(programs["kafka-1"].command)
    assert argv[0] == "java"
    assert argv[argv.index("-cp") + 1] == f"{tmp_path / 'jars' / 'kafka'}/*"
    assert argv[-2:] == [render.KAFKA_MAIN, str(tmp_path / "kafka/node-1/server.properties")]
    assert shlex.split(programs["airflow"].command)[-2:] == ["twinstream.stack.launch", "airflow"]


def test_a_percent_sign_in_a_path_is_refused_with_a_reason(tmp_path):
    s = _settings(tmp_path / "odd%(here)sdir")
    with pytest.raises(ValueError, match="contains '%'"):
        render.supervisord_conf(s, Layout.of(s), "/usr/bin")


def test_a_quote_in_a_setting_is_refused_not_mangled(tmp_path):
    s = _settings(tmp_path / 'say"hi')
    with pytest.raises(ValueError, match="environment="):
        render.supervisord_conf(s, Layout.of(s), "/usr/bin")


def test_each_engine_runs_under_supervision_with_its_id(tmp_path):
    options = _parse_supervisord_conf(tmp_path, _settings(tmp_path))
    programs = {p.name: p for g in options.process_group_configs for p in g.process_configs}
    for engine_id in ("a", "b"):
        engine = programs[f"engine-{engine_id}"]
        argv = shlex.split(engine.command)
        assert argv[1].endswith("spark_jobs/engine.py")
        assert argv[-2:] == ["--engine-id", engine_id]
        assert engine.autorestart is not False
        assert engine.environment["PYSPARK_PYTHON"] == argv[0]


def test_airflow_gets_engine_connections_and_not_the_callers_test_mode(tmp_path):
    import json

    from twinstream.stack.launch import LOCAL_FILESYSTEM_BACKEND, airflow_environment

    settings = _settings(tmp_path, admin_token="tok")
    env = airflow_environment(
        settings, {"PATH": "/bin", "AIRFLOW__CORE__UNIT_TEST_MODE": "True", "KEEP": "1"}
    )
    assert "AIRFLOW__CORE__UNIT_TEST_MODE" not in env
    assert env["KEEP"] == "1"
    # The engines' connections are not in Airflow's environment but in the file `up` writes,
    # which Airflow's own secrets backend reads.
    assert not [k for k in env if k.startswith("AIRFLOW_CONN_TWINSTREAM_ENGINE")]
    assert env["AIRFLOW__SECRETS__BACKEND"] == LOCAL_FILESYSTEM_BACKEND
    kwargs = json.loads(env["AIRFLOW__SECRETS__BACKEND_KWARGS"])
    assert kwargs == {"connections_file_path": str(Layout.of(settings).airflow_connections)}
    conns = json.loads(render.airflow_connections(settings))
    assert conns["twinstream_engine_b"] == {
        "conn_type": "http",
        "host": "127.0.0.1",
        "port": 8702,
        "schema": "http",
        "password": "tok",
    }


def test_make_ups_airflow_runs_the_dags_scheduled_and_the_tests_keeps_them_paused(tmp_path):
    from twinstream.stack.launch import airflow_environment

    scheduled = airflow_environment(_settings(tmp_path, admin_token="tok"), {"PATH": "/bin"})
    assert scheduled["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] == "False"
    # A caller's own value does not win over the setting: the setting is what `up` means.
    paused = airflow_environment(
        _settings(tmp_path, admin_token="tok", dags_paused=True),
        {"PATH": "/bin", "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False"},
    )
    assert paused["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] == "True"


def test_the_tests_stack_keeps_its_dags_paused():
    from tests.conftest import TEST_ENV

    assert TEST_ENV["TWINSTREAM_DAGS_PAUSED"].lower() == "true"


def test_adding_a_pipeline_leaves_airflows_program_alone_and_changes_its_connections(tmp_path):
    """supervisord restarts a program whose section changes: Airflow's must not change
    when a pipeline is added (issue: `make up` restarted Airflow for two new engines), while
    the connections file Airflow reads at every lookup gains the new engines."""
    import json

    path = tmp_path / "pipelines.toml"
    one = '[hostmetrics]\nmodule = "m.h"\n'
    path.write_text(one)
    s = _settings(tmp_path, pipelines_file=path, admin_token="tok")
    layout = Layout.of(s)

    def airflow_section() -> str:
        text = render.supervisord_conf(s, layout, "/venv/bin:/usr/bin")
        return text.split("[program:airflow]")[1].split("\n\n")[0]

    before, conns_before = airflow_section(), render.airflow_connections(s)
    path.write_text(
        one + '[shop]\nmodule = "m.s"\nengines = ["e", "f"]\nadmin_ports = [8705, 8706]\n'
    )
    after, conns_after = airflow_section(), render.airflow_connections(s)
    assert "engine-e" in render.supervisord_conf(s, layout, "/venv/bin:/usr/bin")
    assert after == before
    assert conns_after != conns_before
    assert json.loads(conns_after)["twinstream_engine_f"]["port"] == 8706
    assert "twinstream_engine_f" not in json.loads(conns_before)


def test_airflows_own_secrets_backend_reads_the_rewritten_file_at_every_lookup(tmp_path):
    """The mechanism the stack relies on, Airflow's LocalFilesystemBackend as launch
    configures it: one backend instance (Airflow builds it once per process) finds an engine
    written into the file after its first lookup, with its token and CA."""
    from airflow.secrets.local_filesystem import LocalFilesystemBackend

    path = tmp_path / "pipelines.toml"
    one = '[hostmetrics]\nmodule = "m.h"\n'
    path.write_text(one)
    s = _settings(tmp_path, pipelines_file=path, admin_token="secret-token")
    file = Layout.of(s).airflow_connections
    file.parent.mkdir(parents=True)
    file.write_text(render.airflow_connections(s))
    backend = LocalFilesystemBackend(connections_file_path=str(file))
    first = backend.get_connection("twinstream_engine_a")
    assert first is not None
    assert first.port == 8701
    assert backend.get_connection("twinstream_engine_e") is None
    path.write_text(one + '[shop]\nmodule = "m.s"\nengines = ["e"]\nadmin_ports = [8705]\n')
    file.write_text(render.airflow_connections(s))
    conn = backend.get_connection("twinstream_engine_e")
    assert conn is not None
    assert (conn.host, conn.port, conn.schema) == ("127.0.0.1", 8705, "http")
    assert conn.password == "secret-token"


def test_https_engines_connections_carry_the_ca_the_dags_verify_them_with(tmp_path):
    import json

    from tests.unit.engine.test_api import write_tls_files
    from twinstream.engine.client import EngineClient
    from twinstream.stack.launch import engine_connections

    tls = write_tls_files(tmp_path)
    settings = _settings(tmp_path, admin_token="tok", admin_tls_cafile=str(tls.ca))
    conn = json.loads(engine_connections(settings)["AIRFLOW_CONN_TWINSTREAM_ENGINE_A"])
    assert conn["schema"] == "https"
    assert conn["extra"] == {"ca": str(tls.ca)}
    client = EngineClient.from_connection(
        "a", conn["host"], conn["port"], conn["schema"], conn["password"], extra=conn["extra"]
    )
    assert client.base_url == "https://127.0.0.1:8701"
    client.close()


def test_every_pipelines_engines_run_and_each_finds_its_own_pipeline(tmp_path, monkeypatch):
    from twinstream.platform import registry

    path = tmp_path / "pipelines.toml"
    path.write_text(
        '[hostmetrics]\nmodule = "m.h"\n\n'
        '[payments]\nmodule = "m.p"\nengines = ["c", "d"]\nadmin_ports = [8703, 8704]\n'
    )
    s = _settings(tmp_path, pipelines_file=path)
    programs = {p.name: p for p in render.programs(s, Layout.of(s))}
    engines = {n: p for n, p in programs.items() if n.startswith("engine-")}
    assert sorted(engines) == ["engine-a", "engine-b", "engine-c", "engine-d"]
    # One environment for every engine; each resolves its pipeline as engine.py does.
    for name, program in engines.items():
        for key, value in program.environment.items():
            monkeypatch.setenv(key, value)
        engine_id = name.removeprefix("engine-")
        mine = registry.for_engine(load_settings(pipeline="hostmetrics"), engine_id)
        expected = "payments" if engine_id in "cd" else "hostmetrics"
        assert (mine.pipeline, mine.inbound_topic) == (expected, f"{expected}.in")
        assert engine_id in mine.engine_ids
    assert mine.engine_admin_port("d") == 8704


def test_launch_replaces_itself_with_the_rendered_spark_master_or_worker(tmp_path, monkeypatch):
    """Compose's spark-cluster services run `python -m twinstream.stack.launch spark-...`:
    the same command and environment supervisord gives those programs."""
    from twinstream.stack import launch

    monkeypatch.setenv("TWINSTREAM_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("TWINSTREAM_SPARK_MASTER_HOST", "spark-master")
    monkeypatch.setenv("TWINSTREAM_SPARK_WORKER_HOST", "spark-worker")
    calls = []

    def execvpe(*args):
        # exec never returns: nothing after it in main may run.
        calls.append(args)
        raise SystemExit(0)

    monkeypatch.setattr("os.execvpe", execvpe)
    with pytest.raises(SystemExit):
        launch.main(["spark-worker"])
    (file, argv, env) = calls[0]
    assert file == argv[0] == "java"
    assert argv[argv.index(render.SPARK_WORKER_MAIN) + 1] == "spark://spark-master:7077"
    assert argv[argv.index("--host") + 1] == "spark-worker"
    assert env["SPARK_LOCAL_IP"] == "spark-worker"
    with pytest.raises(SystemExit, match=r"airflow\|spark-master\|spark-worker"):
        launch.main(["spark"])


@pytest.mark.parametrize(("niceness", "expected"), [("", None), ("0", None), ("10", 10)])
def test_airflow_and_everything_it_starts_run_below_the_engines(
    tmp_path, monkeypatch, niceness, expected
):
    """`launch airflow` lowers its own priority before it becomes `airflow standalone`, so
    that every task and Spark job Airflow starts inherits it (issue 52)."""
    from twinstream.stack import launch

    monkeypatch.setenv("TWINSTREAM_STATE_DIR", str(tmp_path))
    if niceness:
        monkeypatch.setenv("TWINSTREAM_AIRFLOW_NICENESS", niceness)
    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr("os.setpriority", lambda *args: calls.append(("setpriority", *args)))

    def execve(*args):
        calls.append(("execve", args[1][1]))
        raise SystemExit(0)

    monkeypatch.setattr("os.execve", execve)
    with pytest.raises(SystemExit):
        launch.main(["airflow"])
    lowered = [] if expected is None else [("setpriority", os.PRIO_PROCESS, 0, expected)]
    assert calls == [*lowered, ("execve", "standalone")]
