"""The publish tool's inputs: CSV typed by a pipeline's schema, JSONL as it is."""

import json
from typing import Any

import pytest

from pipelines.hostmetrics.logic import SCHEMA
from tests.unit.fakes import FakeClock
from twinstream.contract import field_types
from twinstream.edge import feed as publisher
from twinstream.edge.feed import from_file
from twinstream.platform.settings import load_settings


def test_csv_rows_become_typed_json_and_bad_values_pass_through_for_the_dead_letter_topic(
    tmp_path,
):
    path = tmp_path / "m.csv"
    path.write_text(
        "host,ts,cpu_user,cpu_system,mem_used_mb,mem_free_mb,extra\n"
        "web-1,2026-11-22T10:00:00Z,12.5,3,2048,6144,ignored\n"
        "web-2,2026-11-22T10:00:01Z,lots,3,2048,6144,x\n"
    )
    good, bad = (json.loads(r) for r in from_file(path, field_types(SCHEMA)))
    assert good == {
        "host": "web-1",
        "ts": "2026-11-22T10:00:00Z",
        "cpu_user": 12.5,
        "cpu_system": 3.0,
        "mem_used_mb": 2048,
        "mem_free_mb": 6144,
    }
    # The pipeline dead-letters it (wrong_type), not the tool.
    assert bad["cpu_user"] == "lots"


def test_an_empty_cell_of_an_optional_member_is_left_out_and_of_a_required_one_sent(tmp_path):
    # CSV has no null: an optional member's empty cell is the member absent (the contract
    # reads it as NULL); a required member's stays "" for the pipeline to dead-letter.
    path = tmp_path / "clicks.csv"
    path.write_text("user,amount\nu-1,\nu-2,12.5\n,3\n")
    fields = {"user": "string", "amount": "double"}
    rows = [json.loads(r) for r in from_file(path, fields, optional=("amount",))]
    assert rows == [{"user": "u-1"}, {"user": "u-2", "amount": 12.5}, {"user": "", "amount": 3.0}]
    # An optional member's column may be missing from the header altogether.
    path.write_text("user\nu-1\n")
    assert [json.loads(r) for r in from_file(path, fields, optional=("amount",))] == [
        {"user": "u-1"}
    ]


def test_jsonl_lines_are_sent_as_they_are(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"host": "a"}\n\n{not json}\r\n')
    assert list(from_file(path)) == [b'{"host": "a"}', b"{not json}"]


def test_a_csv_without_the_fields_or_an_unknown_suffix_is_refused_by_name(tmp_path):
    csv_path = tmp_path / "m.csv"
    csv_path.write_text("host,ts\nweb-1,2026-11-22T10:00:00Z\n")
    with pytest.raises(ValueError, match="CSV header lacks cpu_user, cpu_system"):
        list(from_file(csv_path, field_types(SCHEMA)))
    with pytest.raises(ValueError, match="needs the pipeline's fields"):
        list(from_file(csv_path))
    with pytest.raises(ValueError, match=r"want \.csv or \.jsonl"):
        list(from_file(tmp_path / "m.parquet"))


class _FakeProducer:
    """Acknowledges every record at the next poll, as a healthy cluster would."""

    def __init__(self, config: dict[str, object]) -> None:
        self.config = config
        self.pending: list[Any] = []
        self.keys: list[bytes | None] = []

    def produce(self, topic: str, key: bytes | None, value: bytes, on_delivery: Any) -> None:
        self.keys.append(key)
        self.pending.append(on_delivery)

    def poll(self, _timeout: float) -> int:
        done, self.pending = self.pending, []
        for callback in done:
            callback(None, None)
        return len(done)

    def flush(self, _timeout: float) -> int:
        self.poll(0)
        return 0


def test_the_paced_feeder_batches_its_sends_instead_of_a_request_per_record(monkeypatch):
    # At the 5 ms default linger, paced sends at 1,000/s cost most of a core in
    # librdkafka's broker thread, on the cores the engines under test need.
    made: list[_FakeProducer] = []

    def producer(config: dict[str, object]) -> _FakeProducer:
        made.append(_FakeProducer(config))
        return made[-1]

    monkeypatch.setattr(publisher, "Producer", producer)
    clock = FakeClock()
    progress = publisher.publish(
        load_settings(zk_password="unit-test"),
        [b"{}"] * 100,
        rate=1000,
        clock=clock,
        sleep=clock.sleep,
    )
    assert progress.acked == 100
    (config,) = [p.config for p in made]
    assert isinstance(config["linger.ms"], int)
    assert config["linger.ms"] >= 20
    assert config["acks"] == "all"
    assert clock.now == pytest.approx(0.1)  # paced: 100 records at 1,000/s


def test_records_are_keyed_by_the_pipelines_partition_member_so_a_key_keeps_one_partition(
    monkeypatch,
):
    made: list[_FakeProducer] = []

    def producer(config: dict[str, object]) -> _FakeProducer:
        made.append(_FakeProducer(config))
        return made[-1]

    monkeypatch.setattr(publisher, "Producer", producer)
    records = [b'{"card": "c-1", "amount": 3}', b'{"card": 42}', b"not json", b'{"x": 1}', None]
    publisher.publish(load_settings(zk_password="unit-test"), records, key_field="card")
    assert made[0].keys == [b"c-1", b"42", None, None, None]
    publisher.publish(load_settings(zk_password="unit-test"), records[:1])
    assert made[1].keys == [None]  # no partition member: unkeyed, as before
