"""The publisher adapter's HTTP source: a request is answered once its lines are committed,
and the same key again publishes nothing, also after a takeover
(twinstream.edge.http_source)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from tests.unit.edge.test_publisher_adapter import TOPICS, Cluster
from twinstream.edge.http_source import HttpSource
from twinstream.edge.publisher import SOURCE_HEADER, PublisherAdapter


def post(
    port: int, key: str | None, lines: list[dict[str, object]]
) -> tuple[int, dict[str, object]]:
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/records", data=body, method="POST")
    if key is not None:
        request.add_header("Idempotency-Key", key)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def leading(tmp_path) -> Iterator[Callable[[Cluster], tuple[HttpSource, PublisherAdapter]]]:
    """An adapter leading with an HTTP source, on a thread, until the test ends."""
    started: list[tuple[HttpSource, PublisherAdapter, threading.Thread]] = []

    def start(cluster: Cluster) -> tuple[HttpSource, PublisherAdapter]:
        source = HttpSource(
            "127.0.0.1",
            0,
            recent=lambda: [h[SOURCE_HEADER] for _v, _k, h in cluster.committed],
            poll_s=0.01,
        )
        source.start()

        def factory(idle: Callable[[float], None]) -> HttpSource:
            source.idle = idle
            return source

        adapter = PublisherAdapter(
            f"p{len(started)}", TOPICS, factory, cluster.producer, cluster.resume, key_field="host"
        )
        adapter._leading.set()
        thread = threading.Thread(target=adapter.publish, args=(len(started) + 1,), daemon=True)
        thread.start()
        started.append((source, adapter, thread))
        # Leading once it has read the recent keys (a request before that is answered 503,
        # for the client to send again).
        assert source._serving.wait(5)
        return source, adapter

    yield start
    for source, adapter, thread in started:
        adapter._leading.clear()
        thread.join(5)
        source.close()


def test_a_request_is_answered_once_committed_and_a_retry_publishes_nothing(leading):
    cluster = Cluster()
    source, _adapter = leading(cluster)
    status, body = post(source.port, "req-1", [{"host": "h1", "n": 1}, {"host": "h2", "n": 2}])
    assert (status, body["records"], body["committed"]) == (200, 2, "now")
    assert len(cluster.committed) == 2
    # The client timed out and sends it again.
    status, body = post(source.port, "req-1", [{"host": "h1", "n": 1}, {"host": "h2", "n": 2}])
    assert (status, body["committed"]) == (200, "earlier")
    assert len(cluster.committed) == 2


def test_after_a_takeover_a_retry_of_a_request_the_old_active_committed_publishes_nothing(
    leading,
):
    cluster = Cluster()
    first, old = leading(cluster)
    assert post(first.port, "req-7", [{"host": "h1", "n": 7}])[0] == 200
    old._leading.clear()  # the old active dies; its answer never reached the client
    second, _new = leading(cluster)
    status, body = post(second.port, "req-7", [{"host": "h1", "n": 7}])
    assert (status, body["committed"]) == (200, "earlier")
    assert len(cluster.committed) == 1


def test_bad_requests_and_a_standby_are_refused_with_the_reason(tmp_path):
    source = HttpSource("127.0.0.1", 0)
    source.start()
    try:
        status, body = post(source.port, None, [{"n": 1}])
        assert status == 400
        assert "Idempotency-Key" in str(body["reason"])
        status, body = post(source.port, "k", [{"n": 1}])
        assert status == 503
        assert "not the active one" in str(body["reason"])
    finally:
        source.close()
