"""A publisher adapter's Prometheus metrics (twinstream.edge.publisher_metrics): read from
its status at each scrape, unknown figures absent, behind the engines' token; `make up`
gives each publisher program a port of its own (twinstream.stack.render); and the whole
adapter process (`publisher.run`) with standard input and /metrics, over fakes of ZooKeeper
and Kafka."""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.unit.edge.test_publisher_adapter import Cluster, Znodes
from twinstream.edge import publisher
from twinstream.edge.publisher import Status
from twinstream.edge.publisher_metrics import MetricsServer, PublisherMetrics
from twinstream.platform import registry
from twinstream.platform.settings import Settings, SettingsError, load_settings
from twinstream.stack import render
from twinstream.stack.layout import Layout


def samples(text: str) -> dict[str, float]:
    """`name{labels} value` lines of Prometheus text, by name and labels."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


LABELS = 'adapter="in-1",pipeline="hostmetrics"'


def test_the_figures_are_the_status_and_an_unknown_lag_has_no_sample():
    metrics = PublisherMetrics("in-1", "hostmetrics")
    status = Status(role="active", epoch=3, published=120, too_long=1, source_lag=4096)
    seen = samples(metrics.page(status).decode())
    assert seen[f"twinstream_publisher_active{{{LABELS}}}"] == 1
    assert seen[f"twinstream_publisher_epoch{{{LABELS}}}"] == 3
    assert seen[f"twinstream_publisher_published_total{{{LABELS}}}"] == 120
    assert seen[f"twinstream_publisher_source_lag_bytes{{{LABELS}}}"] == 4096
    assert seen[f'twinstream_publisher_unreadable_lines_total{{{LABELS},reason="too_long"}}'] == 1
    assert seen[f'twinstream_publisher_unreadable_lines_total{{{LABELS},reason="not_utf8"}}'] == 0
    assert seen[f"twinstream_publisher_lost_total{{{LABELS}}}"] == 0
    # Stepped down: no lag of its own to tell; the counters keep what they counted.
    status.role, status.source_lag = "standby", None
    status.not_utf8, status.lost = 2, ["after f@1.a:9: gone"]
    seen = samples(metrics.page(status).decode())
    assert seen[f"twinstream_publisher_active{{{LABELS}}}"] == 0
    assert not [name for name in seen if name.startswith("twinstream_publisher_source_lag")]
    assert seen[f"twinstream_publisher_published_total{{{LABELS}}}"] == 120
    assert seen[f'twinstream_publisher_unreadable_lines_total{{{LABELS},reason="not_utf8"}}'] == 2
    assert seen[f"twinstream_publisher_lost_total{{{LABELS}}}"] == 1
    status.source_lag = 10
    seen = samples(metrics.page(status).decode())
    assert seen[f"twinstream_publisher_source_lag_bytes{{{LABELS}}}"] == 10


def get(url: str, token: str | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_metrics_need_the_token_and_health_does_not():
    metrics = PublisherMetrics("in-1", "hostmetrics")
    server = MetricsServer("127.0.0.1", 0, "secret", lambda: metrics.page(Status()))
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert get(f"{base}/metrics")[0] == 401
        assert get(f"{base}/metrics", "wrong")[0] == 401
        assert get(f"{base}/nosuch")[0] == 401  # a stranger learns no path
        status, kind, body = get(f"{base}/metrics", "secret")
        assert (status, kind) == (200, "text/plain; version=0.0.4")
        assert f"twinstream_publisher_active{{{LABELS}}} 0.0" in body
        assert get(f"{base}/healthz")[:2] == (200, "text/plain")
        assert get(f"{base}/nosuch", "secret")[0] == 404
    finally:
        server.close()


# -- make up: a port for each publisher program ---------------------------------------------


def _stack(tmp_path: Path, **env: Any) -> tuple[Settings, dict[str, Settings]]:
    path = tmp_path / "pipelines.toml"
    path.write_text(
        '[shop]\nmodule = "shop.pipeline"\nengines = ["e", "f"]\nadmin_ports = [8705, 8706]\n'
        'publishers = { source = "/data/shop", count = 2 }\n'
        '[bank]\nmodule = "bank.pipeline"\nengines = ["g", "h"]\nadmin_ports = [8707, 8708]\n'
        'publishers = { source = "/data/bank", count = 3 }\n'
    )
    settings = load_settings(pipeline="hostmetrics", pipelines_file=path, state_dir=tmp_path, **env)
    return settings, dict(registry.stack(settings))


def _ports(settings: Settings, stack: dict[str, Settings]) -> dict[str, str]:
    found = {}
    for program in render.programs(settings, Layout.of(settings), pipelines=stack):
        if program.name.startswith("publisher-"):
            command = list(program.command)
            i = command.index("--metrics-port") if "--metrics-port" in command else None
            found[program.name] = "" if i is None else command[i + 1]
    return found


def test_each_publisher_program_serves_metrics_on_its_own_port_from_the_settings(tmp_path):
    settings, stack = _stack(tmp_path)
    assert _ports(settings, stack) == {
        "publisher-shop-1": "8811",
        "publisher-shop-2": "8812",
        "publisher-bank-1": "8813",
        "publisher-bank-2": "8814",
        "publisher-bank-3": "8815",
    }
    settings, stack = _stack(tmp_path, publisher_metrics_ports=[])
    assert set(_ports(settings, stack).values()) == {""}  # none asked: no /metrics


def test_too_few_metrics_ports_or_an_engines_port_are_refused_with_the_fix(tmp_path):
    settings, stack = _stack(tmp_path, publisher_metrics_ports=[9001, 9002])
    with pytest.raises(SettingsError, match=r"5 publisher adapters .* has 2 ports"):
        render.programs(settings, Layout.of(settings), pipelines=stack)
    settings, stack = _stack(tmp_path, publisher_metrics_ports=[9001, 9002, 8707, 9004, 9005])
    with pytest.raises(SettingsError, match=r"\[8707\], which engines of the stack use"):
        render.programs(settings, Layout.of(settings), pipelines=stack)


def test_the_default_metrics_ports_clash_with_no_other_port_of_the_stack():
    settings = Settings(pipeline="hostmetrics")
    assert set(settings.publisher_metrics_ports) <= set(settings.ports)
    assert len(set(settings.ports)) == len(settings.ports)
    with pytest.raises(ValueError, match="ports are used twice"):
        Settings(pipeline="hostmetrics", publisher_metrics_ports=[8701])


# -- the adapter process, over fakes ---------------------------------------------------------


class FakeZk(Znodes):
    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return found


def test_an_adapter_process_on_standard_input_serves_its_metrics_and_ends_with_its_input(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """`twinstream publish --source - --metrics-port N`: elected, it publishes what its
    standard input gives, says so at /metrics and in its status node, and stops once its
    input ended and every line is committed."""
    import confluent_kafka

    import twinstream.core.election as election
    import twinstream.platform.kafka as kafka

    cluster = Cluster()
    zk = FakeZk()

    class Elected:
        """The election, won at once."""

        def __init__(self, *_a: object, on_elected: Callable[[int], None], **_kw: object):
            self.on_elected = on_elected

        def start(self) -> None:
            self.on_elected(1)

        def stop(self) -> None:
            pass

        def resign(self) -> None:
            pass

    monkeypatch.setattr(election, "zk_client", lambda _c: zk)
    monkeypatch.setattr(election, "root_acl", lambda _c: None)
    monkeypatch.setattr(election, "Election", Elected)
    monkeypatch.setattr(kafka, "connection", lambda _s: _Anything())
    monkeypatch.setattr(confluent_kafka, "Producer", lambda _config: cluster.producer())
    monkeypatch.setattr(publisher, "last_published", lambda _k, _t: cluster.resume())
    settings = load_settings(
        pipeline="hostmetrics", zk_password="zk", admin_token="tok", state_dir=tmp_path
    )
    port = free_port()
    read_end, write_end = os.pipe()
    stop = threading.Event()
    ended: list[Status] = []
    with open(read_end, "rb") as stdin, open(write_end, "wb", buffering=0) as feed:
        running = threading.Thread(
            target=lambda: ended.append(
                publisher.run(
                    settings,
                    "in-1",
                    "-",
                    "*.jsonl",
                    stop,
                    echo=lambda _line: None,
                    stdin=stdin,
                    metrics_port=port,
                )
            ),
            daemon=True,
        )
        running.start()
        feed.write(b'{"host": "h1", "cpu": 0.5}\n' * 30)
        wait_for(lambda: len(cluster.committed) == 30)
        url = f"http://127.0.0.1:{port}/metrics"
        lag = f"twinstream_publisher_source_lag_bytes{{{LABELS}}}"
        # The status is read again each second: wait for the one after the last commit.
        scraped = wait_for(lambda: (seen := samples(get(url, "tok")[2])).get(lag) == 0 and seen)
        assert scraped[f"twinstream_publisher_active{{{LABELS}}}"] == 1
        assert scraped[f"twinstream_publisher_published_total{{{LABELS}}}"] == 30
        node = zk.nodes["/twinstream/hostmetrics/publishers/status/in-1"]
        assert b'"source_lag": 0' in node
        assert b'"position": "stdin@0.L30:' in node
        feed.close()  # standard input ends: the adapter is done
        running.join(10)
    assert not running.is_alive()
    assert not stop.is_set()  # it stopped by itself
    assert ended[0].published == 30
    with pytest.raises(urllib.error.URLError):
        get(f"http://127.0.0.1:{port}/healthz")  # its server is closed


class _Anything:
    """A Kafka connection whose configs are never read (the producer is a fake)."""

    def producer(self, **_kw: object) -> dict[str, object]:
        return {}
