"""Health probes of the stack's services. Each returns (healthy, one-line detail)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
from confluent_kafka.admin import AdminClient

from twinstream.engine.api import PipelineInfo
from twinstream.engine.client import EngineClient, EngineError
from twinstream.platform.kafka import admin_config
from twinstream.platform.settings import Connections, Settings
from twinstream.stack.tls import kafka_superuser_config

Probe = Callable[[], tuple[bool, str]]


def four_letter_word(host: str, port: int, word: bytes, timeout_s: float = 2.0) -> bytes:
    with socket.create_connection((host, port), timeout=timeout_s) as conn:
        conn.sendall(word)
        chunks = []
        while chunk := conn.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


def zookeeper(settings: Connections, node: int = 1) -> tuple[bool, str]:
    """One server of the stack's ZooKeeper (`node`, from 1). ruok only says the JVM listens;
    srvr's Mode line says the server actually serves (standalone, leader or follower: a
    member of an ensemble without a quorum answers that it is not serving)."""
    address = settings.zk_servers[node - 1]
    try:
        answer = four_letter_word(*address, b"ruok")
        if answer != b"imok":
            return False, f"ruok answered {answer!r}"
        stats = four_letter_word(*address, b"srvr").decode()
    except OSError as exc:
        return False, f"no answer on {address[0]}:{address[1]}: {exc}"
    for line in stats.splitlines():
        if line.startswith("Mode:"):
            return True, f"serving, mode {line.split(':', 1)[1].strip()}"
    return False, f"not serving: {stats.strip()[:120]}"


def _master_status(ui_url: str, timeout_s: float) -> tuple[dict[str, Any] | None, str]:
    """The standalone master's own status page (JSON), or None and why not."""
    url = f"{ui_url}/json/"
    try:
        status: dict[str, Any] = httpx.get(url, timeout=timeout_s).json()
    except (httpx.HTTPError, ValueError) as exc:
        return None, f"no answer at {url}: {type(exc).__name__}"
    return status, ""


def spark_master(ui_url: str, timeout_s: float = 3.0) -> tuple[bool, str]:
    """The master ALIVE (its web UI at `ui_url`), and how many workers."""
    status, problem = _master_status(ui_url, timeout_s)
    if status is None:
        return False, problem
    if status.get("status") != "ALIVE":
        return False, f"master {status.get('status')}"
    return True, f"{status.get('url')}, {status.get('aliveworkers', 0)} worker(s) alive"


def spark_worker(ui_url: str, timeout_s: float = 3.0) -> tuple[bool, str]:
    """A worker counts once the master (its web UI at `ui_url`) lists it ALIVE, with its
    cores."""
    status, problem = _master_status(ui_url, timeout_s)
    if status is None:
        return False, problem
    workers = status.get("workers", [])
    alive = [w for w in workers if w.get("state") == "ALIVE"]
    if not alive:
        return False, f"no worker registered with the master ({len(workers)} known)"
    return True, f"registered, {alive[0].get('cores')} cores, {alive[0].get('memory')} MB"


def kafka_brokers(
    settings: Settings, timeout_s: float = 3.0, as_stack: bool = False
) -> dict[int, str]:
    """Broker ids registered in the cluster metadata, with their host:port. As the admin,
    or `as_stack` (`up`, where the servers' key is: before it has made the users, the
    admin's login fails)."""
    config = kafka_superuser_config if as_stack else admin_config
    admin = AdminClient(
        config(
            settings,
            **{
                "socket.connection.setup.timeout.ms": 2000,
                # Refused connections are the expected answer while brokers start; the probe
                # reports them itself instead of librdkafka printing one line per attempt.
                "log_level": 0,
            },
        )
    )
    try:
        brokers = admin.list_topics(timeout=timeout_s).brokers
    except Exception:
        return {}
    return {b.id: f"{b.host}:{b.port}" for b in brokers.values()}


def kafka_node(node_id: int, registered: dict[int, str]) -> tuple[bool, str]:
    if node_id in registered:
        return True, f"broker {node_id} registered at {registered[node_id]}"
    return False, f"broker {node_id} not in cluster metadata ({len(registered)} registered)"


def airflow(airflow_url: str, since: float = 0.0, timeout_s: float = 3.0) -> tuple[bool, str]:
    """Airflow's unauthenticated health endpoint: every component must report healthy with
    a heartbeat newer than `since` (epoch seconds), so heartbeats a previous run left in the
    database do not count."""
    url = f"{airflow_url}/api/v2/monitor/health"
    try:
        response = httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return False, f"no answer at {url}: {type(exc).__name__}"
    if response.status_code != 200:
        return False, f"{url} answered {response.status_code}"
    waiting = []
    for name, part in sorted(response.json().items()):
        if not isinstance(part, dict):
            continue
        beats = [v for k, v in part.items() if k.endswith("heartbeat") and v]
        fresh = all(datetime.fromisoformat(v).timestamp() >= since for v in beats)
        if part.get("status") != "healthy" or not fresh:
            waiting.append(name)
    if waiting:
        return False, f"waiting for {', '.join(waiting)}"
    return True, f"healthy at {airflow_url}"


def engine(settings: Connections, engine_id: str, timeout_s: float = 3.0) -> tuple[bool, str, str]:
    """(healthy, detail, role): the engine's pipeline runs and it is active or standby."""
    url = settings.engine_admin_url(engine_id)
    try:
        token = settings.secret("admin_token")
        # From the settings: the https URL and the CA when the admin API has TLS.
        with EngineClient.from_settings(settings, engine_id, token, timeout_s) as client:
            server, info = client.server(), client.pipeline()
    except EngineError as exc:
        what = "no answer" if exc.status is None else f"HTTP {exc.status}"
        return False, f"{what} at {url}: {exc.reason[:200]}", "none"
    role = server.role
    detail = f"{role}, pipeline {info.state}, {standing_text(info)}"
    if info.state != "running":
        return False, f"{detail} ({info.reason})", role
    return role in ("active", "standby"), detail, role


def standing_text(info: PipelineInfo) -> str:
    """An engine's lag and buffer for `make up`'s summary, said the same way for every
    engine: the lag is unknown until the engine has read its inbound topic's ends, and
    each partition's buffer is known once a batch has brought it rows (before, an engine
    has only a total, which says nothing of a partition's bound)."""
    lag = "lag unknown yet" if info.lag is None else f"lag {info.lag:,}"
    if info.buffer_fills:
        buffer = f"buffer {info.buffer_text()}"
    elif info.buffer_fill == 0:
        buffer = "buffer empty (no batch yet)"
    else:
        buffer = (
            f"buffer {info.buffer_fill:,} rows over every partition "
            f"(each partition's bound {info.buffer_size:,})"
        )
    return f"{lag}, {buffer}"
