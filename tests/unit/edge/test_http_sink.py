"""The subscriber adapter's HTTP sink: a batch is sent again with the same idempotency key
until the receiver acknowledges it, and only then is the position kept
(twinstream.edge.http_sink)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.unit.edge.test_file_sink import stream
from twinstream.edge.file_sink import SinkError
from twinstream.edge.http_sink import HttpSink


class Receiver:
    """Answers with `statuses` in turn (then 200), and keeps what it acknowledged by key."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.kept: dict[str, list[dict[str, object]]] = {}
        self.keys: list[str] = []

    def __call__(self, request: urllib.request.Request, timeout_s: float) -> int:
        key = str(request.get_header("Idempotency-key"))
        self.keys.append(key)
        status = self.statuses.pop(0) if self.statuses else 200
        if status == 200:
            body = request.data
            assert isinstance(body, bytes)
            self.kept[key] = [json.loads(line) for line in body.splitlines()]
        return status


def test_a_batch_is_sent_again_with_its_key_until_acknowledged(tmp_path):
    receiver = Receiver(503, 500)
    waits: list[float] = []
    said: list[str] = []
    sink = HttpSink(
        "http://receiver/in", tmp_path / "pos", sleep=waits.append, echo=said.append, send=receiver
    )
    for r in stream(6):
        sink.write(r)
    sink.sync()
    assert len(set(receiver.keys)) == 1  # the same key each time
    assert receiver.keys[0] == "0:0-2,1:0-1,2:0-1"
    assert waits == [1.0, 2.0]
    assert "HTTP 503; sending 0:0-2,1:0-1,2:0-1 again in 1 s" in said[0]
    assert [x["offset"] for x in receiver.kept[receiver.keys[0]]] == [0, 0, 0, 2, 1, 1]
    again = HttpSink("http://receiver/in", tmp_path / "pos", send=receiver)
    assert again.position.next_offsets() == {0: 3, 1: 2, 2: 2}
    assert not again.write(stream(6)[0])


def test_a_crash_before_the_acknowledgement_keeps_no_position(tmp_path):
    def down(request: urllib.request.Request, timeout_s: float) -> int:
        raise OSError("connection refused")

    def crash(_s: float) -> None:
        raise RuntimeError("kill -9")  # the adapter dies while it waits to send again

    sink = HttpSink("http://receiver/in", tmp_path / "pos", sleep=crash, send=down)
    for r in stream(3):
        sink.write(r)
    with pytest.raises(RuntimeError, match="kill -9"):
        sink.sync()
    assert not (tmp_path / "pos").exists()


def test_a_refusal_stops_the_adapter_with_the_receivers_answer(tmp_path):
    sink = HttpSink("http://receiver/in", tmp_path / "pos", send=Receiver(400))
    sink.write(stream(1)[0])
    with pytest.raises(SinkError, match="refused 1 records"):
        sink.sync()


def test_only_an_http_address_is_a_receiver(tmp_path):
    with pytest.raises(SinkError, match="starts with http"):
        HttpSink("file:///etc/passwd", tmp_path / "pos")
