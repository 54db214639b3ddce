"""`twinstream subscribe` (issue 33): every partition, one stable header from the contract
(partition, msg_id, key, declared fields; a field a row lacks is an empty cell), the
msg_id as logs write it, what the CSV cannot show said on stderr; and read_committed
keeps librdkafka off the terminal while a refused login still ends the read with the fix."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException

from twinstream.contract import Pipeline
from twinstream.core.rows import record_id
from twinstream.edge import reader as subscriber
from twinstream.edge.reader import ReadFailed, Record, read_committed
from twinstream.ops import cli
from twinstream.platform import registry
from twinstream.platform.kafka import LibrdkafkaLog
from twinstream.platform.settings import load_settings


@pytest.fixture(autouse=True)
def _one_pipeline_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's environment names the pipeline these commands work on (the
    repository's file lists two: with none chosen, they refuse)."""
    monkeypatch.setenv("TWINSTREAM_PIPELINE", "hostmetrics")


def _identity(frame: Any) -> Any:
    return frame


# Sessions: an update row has every field; a session-closed row has no count or total.
SESSIONS = Pipeline(
    name="sessions",
    schema="session STRING, user STRING",
    transform=_identity,
    key="session",
    value=["user", "events", "total", "closed"],
)


def record(partition: int, offset: int, value: object, key: str | None = "s-1") -> Record:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return Record(
        topic="sessions.out",
        offset=offset,
        key=key,
        raw=raw if value is not None else b"",
        msg_id=offset,
        engine_id="a",
        epoch=1,
        timestamp_ms=0,
        tombstone=value is None,
        partition=partition,
    )


def run(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    contract: Pipeline,
    records: list[Record],
    *args: str,
) -> tuple[int, list[list[str]], str, dict[str, Any]]:
    """`twinstream subscribe ARGS` over `records`; (exit code, CSV rows, stderr, the
    arguments read_committed got)."""
    called: dict[str, Any] = {}

    def fake_read(settings: Any, topic: str, **kwargs: Any) -> Iterator[Record]:
        called.update(kwargs, topic=topic, role=settings.kafka_role)
        yield from records

    monkeypatch.setattr(cli, "read_committed", fake_read)
    monkeypatch.setattr(registry, "load", lambda _settings: contract)
    code = cli.main(["subscribe", *args])
    captured = capsys.readouterr()
    return code, list(csv.reader(io.StringIO(captured.out))), captured.err, called


def test_every_partition_is_read_as_the_reader_into_one_header_from_the_contract(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [
        # The first row lacks fields: the header must not come from it.
        record(0, 214, {"user": "u-1792", "closed": True}),
        record(2, 13, {"user": "u-7", "events": 3, "total": 12.5, "closed": False}, "s-2"),
        record(1, 5, {"events": 1, "user": "u-8", "total": 1.0, "closed": False}, None),
    ]
    code, rows, err, called = run(monkeypatch, capsys, SESSIONS, records)
    assert code == 0
    assert called["partition"] is None  # every partition, not partition 0
    assert called["role"] == "reader"
    assert called["topic"] == "hostmetrics.out"
    assert rows == [
        ["partition", "msg_id", "session", "user", "events", "total", "closed"],
        ["0", "214", "s-1", "u-1792", "", "", "true"],
        ["2", "2:13", "s-2", "u-7", "3", "12.5", "false"],
        ["1", "1:5", "", "u-8", "1", "1.0", "false"],
    ]
    assert err.strip() == "3 records from hostmetrics.out"


def test_value_schema_fields_win_and_a_field_named_like_a_framework_column_is_kept_apart(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As hostmetrics: a text value (serialised by the transform) declared by value_schema,
    # the key a field of it, and the msg_id the transform saw among its fields.
    contract = Pipeline(
        name="metrics",
        schema="host STRING",
        transform=_identity,
        key="host",
        value=["value"],
        value_format="text",
        value_schema="host STRING, msg_id BIGINT, n BIGINT, tags ARRAY<STRING>",
    )
    seen = record_id(2, 7)
    records = [
        record(2, 7, {"host": "h-1", "msg_id": seen, "n": 1, "tags": ["a", "b"]}),
        record(0, 8, None),  # a tombstone: every field empty
    ]
    code, rows, _err, _called = run(monkeypatch, capsys, contract, records)
    assert code == 0
    assert rows == [
        ["partition", "msg_id", "host", "value.msg_id", "n", "tags"],
        ["2", "2:7", "h-1", str(seen), "1", '["a", "b"]'],
        ["0", "8", "", "", "", ""],
    ]


def test_a_text_value_without_a_schema_is_one_column_as_it_is(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    contract = Pipeline(
        name="lines", schema="x STRING", transform=_identity, key=None, value=["line"],
        value_format="text",
    )  # fmt: skip
    records = [record(1, 3, b"not, json"), record(0, 4, b'{"a": 1}')]
    code, rows, err, _called = run(monkeypatch, capsys, contract, records)
    assert code == 0
    assert rows == [
        ["partition", "msg_id", "line"],
        ["1", "1:3", "not, json"],
        ["0", "4", '{"a": 1}'],
    ]
    assert "twinstream subscribe:" not in err


def test_what_the_csv_cannot_show_is_said_on_stderr_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [
        record(0, 1, {"user": "u-1", "extra": 1}),
        record(0, 2, {"user": "u-2", "extra": 2, "more": "x"}),
        record(2, 9, b"not json"),
        record(1, 4, [1, 2]),
    ]
    code, rows, err, _called = run(monkeypatch, capsys, SESSIONS, records)
    assert code == 0
    assert rows[3] == ["2", "2:9", "s-1", "", "", "", ""]
    assert len(rows) == 5
    assert "extra (2 records), more (1 records)" in err
    assert "declare them in its value_schema" in err
    assert "2 values are not JSON objects (the first msg_id 2:9)" in err


@pytest.mark.parametrize(
    ("given", "expected"),
    [("0", 0), ("120", 120), ("1:10,2:20", {1: 10, 2: 20}), (" 0:5", {0: 5})],
)
def test_from_offset_is_every_partitions_or_per_partition(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    given: str,
    expected: object,
) -> None:
    code, _rows, _err, called = run(monkeypatch, capsys, SESSIONS, [], "--from-offset", given)
    assert code == 0
    assert called["start_offset"] == expected
    assert called["partition"] is None


@pytest.mark.parametrize("given", ["-1", "x", "1:", "1:2,1:3", "a:1", "1:-4"])
def test_a_bad_from_offset_names_the_forms_it_takes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], given: str
) -> None:
    code, _rows, err, called = run(monkeypatch, capsys, SESSIONS, [], f"--from-offset={given}")
    assert code == 2
    assert not called
    assert "PARTITION:OFFSET[,PARTITION:OFFSET...]" in err


class FakeMessage:
    def __init__(
        self, partition: int, offset: int = 0, error: KafkaError | None = None, value: bytes = b"v"
    ) -> None:
        self._partition, self._offset, self._error, self._value = partition, offset, error, value

    def error(self) -> KafkaError | None:
        return self._error

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return None

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return [("msg_id", str(self._offset).encode())]

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)


class FakeTopic:
    def __init__(self, partitions: int, error: KafkaError | None = None) -> None:
        self.partitions = dict.fromkeys(range(partitions))
        self.error = error


class FakeConsumer:
    """A consumer of a 3-partition topic: its messages, then nothing; or a login refused."""

    made: ClassVar[list[FakeConsumer]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.assigned: dict[int, int] = {}
        self.messages: list[FakeMessage] = []
        self.refuse_login = False
        self.topic_error: KafkaError | None = None
        self.closed = False
        FakeConsumer.made.append(self)

    def list_topics(self, topic: str, timeout: float) -> Any:
        if self.refuse_login:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata"))
        return SimpleNamespace(topics={topic: FakeTopic(3, self.topic_error)})

    def assign(self, partitions: list[Any]) -> None:
        self.assigned = {tp.partition: tp.offset for tp in partitions}
        self.messages = [
            *(FakeMessage(p, o) for p, o in self.assigned.items() if o >= 0),
            *(FakeMessage(p, error=KafkaError(KafkaError._PARTITION_EOF)) for p in self.assigned),
        ]

    def poll(self, timeout: float) -> FakeMessage | None:
        if self.refuse_login:
            self.config["error_cb"](
                KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: invalid")
            )
            return None
        return self.messages.pop(0) if self.messages else None

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def consumers(monkeypatch: pytest.MonkeyPatch) -> list[FakeConsumer]:
    FakeConsumer.made = []
    monkeypatch.setattr(subscriber, "Consumer", FakeConsumer)
    return FakeConsumer.made


def test_read_committed_reads_every_partition_each_from_its_start_and_logs_quietly(
    consumers: list[FakeConsumer],
) -> None:
    settings = load_settings(pipeline="p", zk_password="x")
    got = list(read_committed(settings, "p.out", {2: 40}, partition=None))
    (consumer,) = consumers
    assert consumer.assigned == {0: OFFSET_BEGINNING, 1: OFFSET_BEGINNING, 2: 40}
    assert [(r.partition, r.offset) for r in got] == [(2, 40)]
    assert isinstance(consumer.config["logger"], LibrdkafkaLog)
    assert callable(consumer.config["error_cb"])
    assert consumer.closed
    every = list(read_committed(settings, "p.out", 5, partition=None))
    assert consumers[1].assigned == {0: 5, 1: 5, 2: 5}
    assert sorted(r.partition for r in every) == [0, 1, 2]
    with pytest.raises(ValueError, match=r"p.out has no partition 7: it has 3 \(0..2\)"):
        list(read_committed(settings, "p.out", {7: 1}, partition=None))


def test_a_refused_login_ends_the_read_with_the_fix_not_an_empty_result(
    consumers: list[FakeConsumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings(pipeline="p", zk_password="x")
    refused = FakeConsumer.__init__

    def refusing(self: FakeConsumer, config: dict[str, Any]) -> None:
        refused(self, config)
        self.refuse_login = True

    monkeypatch.setattr(FakeConsumer, "__init__", refusing)
    # Every partition: the metadata request is where it shows.
    with pytest.raises(ReadFailed, match=r"refuses the login of the client.*`make up`"):
        list(read_committed(settings, "p.out", partition=None))
    # One partition: nothing arrives, and the refusal is why.
    with pytest.raises(ReadFailed, match="refuses the login"):
        list(read_committed(settings, "p.out", idle_timeout_s=0.0))


def test_librdkafka_writes_nothing_to_the_terminal_through_the_quiet_log(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A refused connection (a closed port on loopback: no service needed) is what
    librdkafka prints on stderr by default; through LibrdkafkaLog it is a DEBUG record."""
    caplog.set_level("DEBUG", logger="twinstream.librdkafka")
    errors: list[KafkaError] = []
    consumer = Consumer(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "group.id": "twinstream-unit",
            "logger": LibrdkafkaLog(),
            "error_cb": errors.append,
        }
    )
    try:
        deadline = time.monotonic() + 10
        while not any("Connection refused" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "librdkafka logged no refused connection"
            consumer.poll(0.2)
    finally:
        consumer.close()
    assert {r.levelname for r in caplog.records if r.name == "twinstream.librdkafka"} == {"DEBUG"}
    assert capfd.readouterr().err == ""


def test_a_topic_the_user_may_not_read_ends_the_read_with_the_fix(
    consumers: list[FakeConsumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings(pipeline="p", zk_password="x")
    made = FakeConsumer.__init__

    def denied(self: FakeConsumer, config: dict[str, Any]) -> None:
        made(self, config)
        self.topic_error = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)

    monkeypatch.setattr(FakeConsumer, "__init__", denied)
    with pytest.raises(ReadFailed, match=r"denies the client reading p.in .*kafka-config"):
        list(read_committed(settings, "p.in", partition=None))


def test_a_refused_read_writes_no_csv_and_says_why_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def refused(settings: Any, topic: str, **kwargs: Any) -> Iterator[Record]:
        raise ReadFailed("Kafka refuses the login of p-reader (...): run `make up`")
        yield  # a generator, as read_committed is: nothing runs before the first next()

    monkeypatch.setattr(cli, "read_committed", refused)
    monkeypatch.setattr(registry, "load", lambda _settings: SESSIONS)
    path = tmp_path / "out.csv"
    assert cli.main(["subscribe", "--output", str(path)]) == 2
    captured = capsys.readouterr()
    assert not path.exists()
    assert captured.out == ""
    assert captured.err.strip() == (
        "twinstream subscribe: Kafka refuses the login of p-reader (...): run `make up`"
    )


def test_subscribe_to_a_file_runs_the_adapter_and_refuses_a_position_given_twice(
    tmp_path, monkeypatch, capsys
):
    from twinstream.edge import subscriber as adapter

    seen: dict[str, object] = {}

    def deliver(settings, sink, stop, echo):
        seen.update(pipeline=settings.pipeline, path=sink.path, offsets=sink.position.offsets)
        return 7

    monkeypatch.setattr(adapter, "deliver", deliver)
    out = tmp_path / "out.jsonl"
    assert cli.main(["subscribe", "--pipeline", "payments", "--to", str(out)]) == 0
    assert seen == {"pipeline": "payments", "path": out, "offsets": {}}
    err = capsys.readouterr().err
    assert f"delivering payments.out to {out} from the start" in err
    assert f"7 records delivered to {out}" in err
    assert cli.main(["subscribe", "--to", str(out), "--from-offset", "5"]) == 2
    assert "--to keeps its own position in its file" in capsys.readouterr().err
