"""Kafka security in docker-compose.yaml, as `make up` has it (twinstream.stack.render
.kafka_listeners): three brokers named kafka-1..3, SASL/SCRAM over TLS for clients, mutual
TLS among brokers and controllers, ACLs. What the compose file's one-shot services run, in
the twinstream image:

    python -m twinstream.stack.compose tls TLS_DIR CA_DIR   # kafka-tls, as root
    python -m twinstream.stack.compose kafka-init           # kafka-init: users, ACLs, topics

and the brokers' security settings, docker/kafka/server.properties (`kafka_properties`;
tests/unit/test_compose.py compares; `python -m twinstream.stack.compose properties` writes).

Guarantee: the brokers' key is readable by its owner and group 0 only (the brokers run as
apache/kafka's user in group 0; kafka-init as Airflow's user, group 0); clients get the CA's
certificate alone, in a volume of its own.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from twinstream.platform.connections import MECHANISM
from twinstream.platform.kafka_auth import ADMIN_USER, PASSWORD, CredentialsError
from twinstream.platform.settings import REPO_ROOT, Settings
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
        "# (twinstream/stack/compose.py); tests/unit/test_compose.py checks it.",
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
    from twinstream.platform import registry
    from twinstream.stack.core import provision_kafka

    pipelines = registry.stack(settings)
    password = admin_password(environ)
    provision_kafka(settings, pipelines, echo, fixed={ADMIN_USER: password})


def main(argv: Sequence[str] | None = None) -> int:
    from twinstream.platform.settings import load_settings

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
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except CredentialsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in lines:
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
