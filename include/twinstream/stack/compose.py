"""Kafka security in docker-compose.yaml, as `make up` has it (twinstream.stack.render
.kafka_listeners): three brokers named kafka-1..3, SASL/SCRAM over TLS for clients, mutual
TLS among brokers and controllers, ACLs. What the compose file's one-shot services run, in
the twinstream image:

    python -m twinstream.stack.compose tls TLS_DIR CA_DIR   # kafka-tls, as root
    python -m twinstream.stack.compose kafka-init           # kafka-init: users, ACLs, topics

and the brokers' security settings, docker/kafka/server.properties (`kafka_properties`;
tests/unit/stack/test_compose.py compares; `python -m twinstream.stack.compose properties` writes).

The engines' parts of docker-compose.yaml are rendered from pipelines.toml, as many engines
per pipeline as its entry names (`engines = ["a", "b", "c"]`: 1 active + 2 standbys):

    python -m twinstream.stack.compose engines   # rewrites the file's rendered blocks

Guarantees: the brokers' key is readable by its owner and group 0 only (the brokers run as
apache/kafka's user in group 0; kafka-init as Airflow's user, group 0); clients get the CA's
certificate alone, in a volume of its own. Every engine of every pipeline has its service (its
admin port published and probed, its own state volume, the Spark worker's mount of it) and
its Airflow connection; rendering changes nothing outside the marked blocks, and
tests/unit/stack/test_compose.py fails on a file that does not follow pipelines.toml.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from twinstream.platform import registry
from twinstream.platform.connections import MECHANISM
from twinstream.platform.kafka_auth import ADMIN_USER, PASSWORD, CredentialsError
from twinstream.platform.settings import (
    REPO_ROOT,
    Settings,
    SettingsError,
    load_settings,
)
from twinstream.stack.tls import SERVER_CN, TlsFiles, ensure_tls

# Every name a client reaches a broker by: the service names, and the host's localhost.
NAMES = ("kafka-1", "kafka-2", "kafka-3", "localhost")
# Where the brokers find their TLS files and their configuration (the compose file mounts).
KAFKA_TLS = Path("/etc/kafka/tls")
BROKER_TLS = TlsFiles(KAFKA_TLS)
ADMIN_PASSWORD_ENV = "TWINSTREAM_KAFKA_ADMIN_PASSWORD"  # noqa: S105 (a variable's name)


def kafka_properties() -> str:
    """docker/kafka/server.properties: the brokers' security, the same for every node. The
    apache/kafka image takes it as its file input and adds the compose file's KAFKA_*
    variables to it (node id, listeners, durability); the SSL settings live here, as its
    variables would ask for JKS key stores with password files."""
    lines = [
        "# Rendered by `python -m twinstream.stack.compose properties`",
        "# (twinstream/stack/compose.py); tests/unit/stack/test_compose.py checks it.",
        f"sasl.enabled.mechanisms={MECHANISM}",
        *(
            # A broker only checks SCRAM logins: it logs in to no one with a password.
            f"listener.name.{name}.{MECHANISM.lower()}.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            for name in ("internal", "external")
        ),
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={BROKER_TLS.bundle}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={BROKER_TLS.ca}",
        # Only holders of a certificate the CA signed: the brokers, and kafka-init.
        "listener.name.broker.ssl.client.auth=required",
        "listener.name.controller.ssl.client.auth=required",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        # What no ACL allows is denied.
        "allow.everyone.if.no.acl.found=false",
        f"super.users=User:{ADMIN_USER};User:CN={SERVER_CN}",
    ]
    return "\n".join(lines) + "\n"


def health_client_properties() -> str:
    """The brokers' healthcheck client: their own certificate on the mutual-TLS listener."""
    return "\n".join(
        [
            "security.protocol=SSL",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={BROKER_TLS.bundle}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={BROKER_TLS.ca}",
            "",
        ]
    )


PROPERTIES_DIR = REPO_ROOT / "docker" / "kafka"


def write_properties() -> list[Path]:
    PROPERTIES_DIR.mkdir(parents=True, exist_ok=True)
    files = {
        PROPERTIES_DIR / "server.properties": kafka_properties(),
        PROPERTIES_DIR / "health-client.properties": health_client_properties(),
    }
    for path, text in files.items():
        path.write_text(text)
    return list(files)


def make_tls(folder: Path, ca_folder: Path) -> list[str]:
    """The CA and the brokers' certificate in `folder`, readable by group 0 (0640: the
    brokers run in that group, and kafka-init as Airflow's user does); the CA's certificate
    alone in `ca_folder`, for the clients (world-readable: it is public)."""
    files, wrote = ensure_tls(folder, NAMES)
    folder.chmod(0o750)
    for path in folder.iterdir():
        path.chmod(0o640)
    ca_folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(files.ca, ca_folder / "ca.pem")
    (ca_folder / "ca.pem").chmod(0o644)
    return [f"{'made' if wrote else 'kept'} the CA and the brokers' certificate in {folder}"]


def admin_password(environ: dict[str, str]) -> str:
    password = environ.get(ADMIN_PASSWORD_ENV, "")
    if not PASSWORD.match(password):
        raise CredentialsError(
            f"{ADMIN_PASSWORD_ENV} must be 32 to 128 hex digits: make one with "
            "`openssl rand -hex 24` and put it in the environment or .env (README, Security)"
        )
    return password


def kafka_init(settings: Settings, environ: dict[str, str], echo: Callable[[str], None]) -> None:
    """Every pipeline's users (the admin's password the one given), ACLs and topics, as
    `make up` makes them (twinstream.stack.core.provision_kafka)."""
    from twinstream.stack.core import provision_kafka

    pipelines = registry.stack(settings)
    password = admin_password(environ)
    provision_kafka(settings, pipelines, echo, fixed={ADMIN_USER: password})


# -- the engines -------------------------------------------------------------------------

COMPOSE_FILE = REPO_ROOT / "docker-compose.yaml"
# What the compose file mounts at /opt/airflow/pipelines.toml: the engines it renders are
# the ones its containers find there, whatever TWINSTREAM_PIPELINES_FILE says on the host.
COMPOSE_PIPELINES_FILE = REPO_ROOT / "pipelines.toml"
RENDER_COMMAND = "python -m twinstream.stack.compose engines"
# An engine's own state volume, where the engine and the Spark worker (whose executors
# write the state store under the engine's checkpoint) both mount it.
ENGINE_STATE = "/opt/twinstream/state/engines"
BIND = "${TWINSTREAM_BIND_HOST:-127.0.0.1}"
# As everywhere else in the file: compose refuses to start without the token.
ADMIN_TOKEN = (
    "${TWINSTREAM_ADMIN_TOKEN:?set a secret of your own in the environment or .env - "  # noqa: S105 (the variable, no secret)
    "README, Security}"
)
# The rendered blocks of docker-compose.yaml, in the file's order: each between a line
# `# >>> NAME ...` and a line `# <<< NAME`, indented as its opening line.
BLOCKS = ("engine connections", "engine services", "engine state mounts", "engine volumes")


class ComposeFileError(ValueError):
    """docker-compose.yaml lacks a block's markers; the message names them."""


def compose_pipelines(pipelines_file: Path = COMPOSE_PIPELINES_FILE) -> dict[str, Settings]:
    """The pipelines compose runs, name -> settings, as its containers see them: every one
    of the file (kafka-init's registry.stack); a pipeline without `engines` of its own runs
    the file's TWINSTREAM_ENGINE_IDS on _ENGINE_ADMIN_PORTS, which are the settings'
    defaults (tests/unit/stack/test_compose.py), whatever the caller's environment says."""
    defaults = Settings.model_fields
    base = load_settings(
        pipelines_file=pipelines_file,
        pipeline=defaults["pipeline"].default,
        pipeline_module="",
        stack_pipelines=[],
        engine_ids=defaults["engine_ids"].default,
        engine_admin_ports=defaults["engine_admin_ports"].default,
        engine_admin_host="engine-{id}",
    )
    return registry.stack(base)


def engine_blocks(pipelines: Mapping[str, Settings]) -> dict[str, list[str]]:
    """Each rendered block's lines (unindented) for every engine of every pipeline: N
    engines of a pipeline are N services, N connections, N volumes, whatever N is."""
    connections = ["# One connection per engine: its admin API and bearer token (the password)."]
    services: list[str] = []
    mounts: list[str] = []
    volumes: list[str] = []
    for name, pipeline in pipelines.items():
        for engine_id in pipeline.engine_ids:
            port = pipeline.engine_admin_port(engine_id)
            service, volume = f"engine-{engine_id}", f"engine-{engine_id}-state"
            fields = {
                "conn_type": "http",
                "host": service,
                "port": port,
                "schema": "http",
                "password": ADMIN_TOKEN,
            }
            conn = f"AIRFLOW_CONN_{pipeline.engine_conn_id(engine_id).upper()}"
            connections.append(f"{conn}: '{json.dumps(fields, separators=(',', ':'))}'")
            if services:
                services.append("")
            services += [
                f"# Engine {engine_id} of {name}, its admin API on {port}.",
                f"{service}:",
                "  <<: *engine-common",
                '  command: ["python", "/opt/airflow/spark_jobs/engine.py", "--engine-id", '
                f'"{engine_id}"]',
                "  ports:",
                f"    - {BIND}:{port}:{port}",
                "  volumes:",
                "    - ./include:/opt/airflow/include:ro",
                "    - ./spark_jobs:/opt/airflow/spark_jobs:ro",
                "    # The pipelines file and the pipelines it lists "
                "(twinstream.platform.registry).",
                "    - ./pipelines.toml:/opt/airflow/pipelines.toml:ro",
                "    - ./pipelines:/opt/airflow/pipelines:ro",
                f"    - {volume}:{ENGINE_STATE}/{engine_id}",
                "    - snapshots:/opt/twinstream/snapshots",
                "    - kafka-ca:/opt/twinstream/kafka-ca:ro",
                "    - kafka-credentials:/opt/twinstream/kafka-credentials:ro",
                "  healthcheck:",
                "    <<: *engine-healthcheck",
                f'    test: ["CMD", "curl", "-fsS", "http://localhost:{port}/healthz"]',
            ]
            mounts.append(f"- {volume}:{ENGINE_STATE}/{engine_id}")
            volumes.append(f"{volume}:")
    blocks = dict(zip(BLOCKS, (connections, services, mounts, volumes), strict=True))
    return blocks


def with_engines(text: str, pipelines: Mapping[str, Settings]) -> str:
    """The compose file's `text` with its rendered blocks made for `pipelines`; every line
    outside them as it was."""
    lines = text.splitlines()
    for name, body in engine_blocks(pipelines).items():
        begins = [i for i, line in enumerate(lines) if line.strip().startswith(f"# >>> {name}")]
        ends = [i for i, line in enumerate(lines) if line.strip() == f"# <<< {name}"]
        if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
            raise ComposeFileError(
                f"the compose file needs one line `# >>> {name}` and, after it, one line "
                f"`# <<< {name}` around the block `{RENDER_COMMAND}` renders (found "
                f"{len(begins)} and {len(ends)}): put them back where the block belongs"
            )
        begin, end = begins[0], ends[0]
        indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
        lines[begin + 1 : end] = [indent + line if line else "" for line in body]
    return "\n".join(lines) + "\n"


def write_engines(
    compose_file: Path = COMPOSE_FILE, pipelines_file: Path = COMPOSE_PIPELINES_FILE
) -> str:
    """Rewrite the compose file's rendered blocks from the pipelines file; says what."""
    pipelines = compose_pipelines(pipelines_file)
    before = compose_file.read_text()
    after = with_engines(before, pipelines)
    engines = "; ".join(f"{n}: {', '.join(p.engine_ids)}" for n, p in pipelines.items())
    if after == before:
        return f"{compose_file} already runs the engines of {pipelines_file} ({engines})"
    compose_file.write_text(after)
    return f"wrote the engines of {pipelines_file} into {compose_file} ({engines})"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else ""
    try:
        if command == "tls" and len(args) == 3:
            lines = make_tls(Path(args[1]), Path(args[2]))
        elif command == "kafka-init" and len(args) == 1:
            kafka_init(load_settings(), dict(os.environ), print)
            lines = ["kafka-init: users, ACLs and topics ready"]
        elif command == "properties" and len(args) == 1:
            lines = [f"wrote {p}" for p in write_properties()]
        elif command == "engines" and len(args) == 1:
            lines = [write_engines()]
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (CredentialsError, ComposeFileError, SettingsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in lines:
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
