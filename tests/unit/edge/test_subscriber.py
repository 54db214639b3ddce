"""The subscriber adapter reads on from its file's position, waits out Kafka going away,
and stops when asked, its file synced (twinstream.edge.subscriber)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

import pytest
from confluent_kafka import KafkaError, KafkaException

from tests.unit.edge.test_file_sink import stream
from twinstream.edge.file_sink import FileSink
from twinstream.edge.reader import Record
from twinstream.edge.subscriber import deliver
from twinstream.platform.settings import CommonSettings, Settings, load_settings


class Topic:
    """The outbound topic as read_committed reads it: each partition from its start offset;
    the n-th read fails after `fail_after[n]` records with a transport error."""

    def __init__(self, records: list[Record], fail_after: list[int | None], stop: threading.Event):
        self.records = records
        self.fail_after = fail_after
        self.stop = stop
        self.starts: list[dict[int, int]] = []
        self.roles: list[str] = []

    def __call__(
        self,
        settings: CommonSettings,
        topic: str,
        start_offset: int | Mapping[int, int] = 0,
        idle_timeout_s: float = 5.0,
        max_records: int | None = None,
        follow: bool = False,
        partition: int | None = 0,
    ) -> Iterator[Record]:
        assert follow
        assert partition is None
        assert topic == "hostmetrics.out"
        assert isinstance(start_offset, Mapping)
        self.starts.append(dict(start_offset))
        self.roles.append(settings.kafka_role)
        fail = (
            self.fail_after[len(self.starts) - 1]
            if len(self.starts) <= len(self.fail_after)
            else None
        )
        given = 0
        for r in self.records:
            if r.offset < start_offset.get(r.partition, 0):
                continue
            if fail is not None and given == fail:
                raise KafkaException(KafkaError(KafkaError._TRANSPORT, "brokers down"))
            given += 1
            yield r
        if len(self.starts) > len(self.fail_after):
            self.stop.set()  # the topic is quiet: the test is over


@pytest.fixture
def settings() -> Settings:
    return load_settings(pipeline="hostmetrics")


def test_every_record_once_through_kafka_failures_and_a_restart(tmp_path, settings):
    everything = stream(200)
    path = tmp_path / "out.jsonl"
    said: list[str] = []
    waits: list[float] = []

    stop = threading.Event()
    topic = Topic(everything, [50, 30], stop)
    sink = FileSink(path)
    written = deliver(settings, sink, stop, read=topic, sleep=waits.append, echo=said.append)
    sink.close()
    assert written == 200
    assert topic.roles == ["reader"] * len(topic.roles)
    # Each read after a failure starts right after what the file holds.
    assert topic.starts[0] == {}
    assert sum(topic.starts[1].values()) > 0
    assert waits == [1.0, 2.0]
    assert "reading hostmetrics.out failed" in said[0]
    assert "trying again in 1 s" in said[0]

    # The adapter restarted: nothing is delivered twice.
    stop = threading.Event()
    again = FileSink(path)
    assert deliver(settings, again, stop, read=Topic(everything, [], stop), echo=said.append) == 0
    again.close()
    assert len(path.read_text().splitlines()) == 200


def test_stopping_syncs_what_was_written(tmp_path, settings):
    stop = threading.Event()
    sink = FileSink(tmp_path / "out.jsonl")

    def read(*_args: object, **_kw: object) -> Iterator[Record]:
        for r in stream(10):
            stop.set()  # asked to stop while the first record is on its way
            yield r

    assert deliver(settings, sink, stop, read=read) == 1
    assert sink.unsynced == 0
    assert FileSink(tmp_path / "out.jsonl").position.offsets == {0: 0}
