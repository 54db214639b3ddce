"""bench/keys.py's arguments, backlogs and figures, and the plain pipe over several
partitions (bench/plain_pipe.py with fake Kafka clients)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, ClassVar

import pytest

from bench import keys, plain_pipe
from bench.keys import (
    MemorySampler,
    arguments,
    backlog_records,
    drained_at,
    memory_at,
    parse_keys,
    ratios,
    table,
)
from devkit.harness import wait_for


def test_the_defaults_are_the_issue_run():
    args = arguments([])
    assert args.keys == [10, 1_000, 10_000, 100_000, 1_000_000]
    assert args.backlog == 1_000_000
    assert args.partitions == 3


def test_keys_are_a_comma_list_sorted():
    assert parse_keys("10000, 10") == [10, 10_000]
    assert arguments(["--keys", "10,10000", "--backlog", "40000"]).keys == [10, 10_000]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10,ten", "'ten' is not a whole number"),
        ("10,0", "each count >= 1"),
        ("10,10", "10 is given twice"),
    ],
)
def test_a_bad_key_list_is_refused_by_name(text: str, message: str):
    with pytest.raises(Exception, match=message):
        parse_keys(text)


def test_fewer_events_than_keys_is_refused_naming_the_fix(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        arguments(["--keys", "10,100000", "--backlog", "40000"])
    assert "raise --backlog to 100,000 or drop the larger key counts" in capsys.readouterr().err


def test_a_backlog_has_exactly_its_key_count_and_only_valid_events():
    records = list(backlog_records(1_000, 300))
    hosts = [json.loads(r)["host"] for r in records]
    assert len(set(hosts)) == 300
    assert hosts[0] == hosts[300] == "host-000"  # round-robin
    windows: dict[str, Any] = {}
    for msg_id, record in enumerate(records):
        key, value = plain_pipe.transform(windows, msg_id, record)
        assert key is not None, value  # a dead letter has no key
    assert len(windows) == 300
    assert records == list(backlog_records(1_000, 300))  # reproducible


def test_memory_is_read_at_the_drains_end_not_during_shutdown():
    samples = [
        (0.0, {}),
        (1.0, {10: 100}),
        (2.0, {10: 500, 11: 300}),
        (3.0, {10: 400, 11: 200}),
        (4.0, {10: 50}),  # the processes stopping after the last output
    ]
    assert memory_at(samples, 3.2) == ({10: 400, 11: 200}, 800)
    # An exited process not yet reaped reads 0: the reading before it is the end's.
    assert memory_at([*samples[:2], (1.5, {10: 0})], 2.0) == ({10: 100}, 100)
    with pytest.raises(ValueError, match="no memory sample"):
        memory_at(samples, 0.5)


def test_the_drain_ends_at_the_first_sample_with_every_output():
    assert drained_at([(0.0, 0), (1.0, 50), (2.0, 100), (3.0, 101)], 100) == 2.0
    with pytest.raises(ValueError, match="never reach 100"):
        drained_at([(0.0, 0), (1.0, 50)], 100)


def test_ratios_only_where_both_drains_ran():
    def figure(rate: int) -> dict[str, Any]:
        return {"events_per_s": rate, "rss_mb": 1}

    runs = {
        10: {"plain": figure(20_000), "pair": figure(5_000)},
        10_000: {"pair": figure(4_000), "kafka_streams": figure(2_000)},
    }
    assert ratios(runs) == {
        "pair / kafka_streams at 10,000 keys": 2.0,
        "pair / plain at 10 keys": 0.25,
    }
    runs[100_000] = {"pair": figure(3_500)}
    assert ratios(runs)["pair at 100,000 keys / pair at 10 keys"] == 0.7
    text = table(runs, ["plain", "pair", "kafka_streams"])
    assert "100,000" in text
    assert "3,500" in text
    assert " - " in text  # a contender not run at a key count


def test_the_memory_sampler_follows_new_child_processes_only():
    earlier = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        sampler = MemorySampler(every_s=0.05)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            # Until a sample after its exec: one between fork and exec names the parent.
            wait_for(
                lambda: (
                    sampler.names.get(child.pid, "").startswith("python")
                    and any(child.pid in s for _, s in sampler.samples)
                ),
                10,
                "the child sampled as itself",
            )
            sampler.stop()
            assert all(earlier.pid not in s for _, s in sampler.samples)
            rss = max(s[child.pid] for _, s in sampler.samples if child.pid in s)
            assert rss > 1_000_000  # a Python interpreter's resident set
        finally:
            child.kill()
            child.wait(10)
            sampler.stop()
    finally:
        earlier.kill()
        earlier.wait(10)


class FakeMessage:
    def __init__(self, partition: int, offset: int, value: bytes) -> None:
        self._partition, self._offset, self._value = partition, offset, value

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value


class FakeConsumer:
    batches: ClassVar[list[list[FakeMessage]]] = []
    assigned: ClassVar[list[Any]] = []

    def __init__(self, config: Any) -> None:
        pass

    def assign(self, partitions: list[Any]) -> None:
        FakeConsumer.assigned = [(tp.partition, tp.offset) for tp in partitions]

    def consume(self, n: int, timeout: float) -> list[FakeMessage]:
        return FakeConsumer.batches.pop(0) if FakeConsumer.batches else []

    def consumer_group_metadata(self) -> None:
        return None

    def close(self) -> None:
        pass


class FakeProducer:
    committed: ClassVar[list[list[tuple[int, int]]]] = []
    produced = 0

    def __init__(self, config: Any) -> None:
        pass

    def init_transactions(self, timeout: float) -> None:
        pass

    def begin_transaction(self) -> None:
        pass

    def produce(self, topic: str, **kwargs: Any) -> None:
        FakeProducer.produced += 1

    def poll(self, timeout: float) -> None:
        pass

    def send_offsets_to_transaction(self, positions: list[Any], meta: Any, t: float) -> None:
        FakeProducer.committed.append(sorted((tp.partition, tp.offset) for tp in positions))

    def commit_transaction(self, timeout: float) -> None:
        pass

    def flush(self, timeout: float) -> None:
        pass


def test_the_plain_pipe_drains_every_partition_and_commits_each_position(
    monkeypatch: pytest.MonkeyPatch,
):
    records = list(backlog_records(5, 5))
    FakeConsumer.batches = [
        [FakeMessage(0, 0, records[0]), FakeMessage(2, 0, records[1])],
        [FakeMessage(0, 1, records[2]), FakeMessage(1, 0, records[3])],
        [FakeMessage(2, 1, records[4])],
    ]
    FakeProducer.committed, FakeProducer.produced = [], 0
    monkeypatch.setattr(plain_pipe, "Consumer", FakeConsumer)
    monkeypatch.setattr(plain_pipe, "Producer", FakeProducer)
    monkeypatch.setattr(plain_pipe, "consumer_config", lambda *a, **k: {})
    monkeypatch.setattr(plain_pipe, "producer_config", lambda *a, **k: {})
    plain_pipe.drain(None, "in", "out", 5, partitions=3)  # type: ignore[arg-type]
    assert FakeConsumer.assigned == [(0, 0), (1, 0), (2, 0)]
    assert FakeProducer.produced == 5
    # Each transaction carries the next offset of every partition read so far.
    assert FakeProducer.committed == [
        [(0, 1), (2, 1)],
        [(0, 2), (1, 1), (2, 1)],
        [(0, 2), (1, 1), (2, 2)],
    ]
    assert not FakeConsumer.batches  # it stopped at the backlog's end


def test_the_module_names_its_command():
    assert "python -m bench.keys --keys 10,10000 --backlog 40000" in (keys.__doc__ or "")
