"""Inbound records for users and tests: a synthetic host-metrics generator (with optional
broken records of every kind the pipeline rejects), file readers (CSV, JSONL), and a
rate-limited producer with a progress line."""

from __future__ import annotations

import csv
import json
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import KafkaError, Producer

from twinstream.config import Settings
from twinstream.hostmetrics import FIELDS
from twinstream.kafka import producer_config

FEEDER_LINGER_MS = 50

BROKEN_KINDS = ("not_json", "missing_field", "wrong_type", "bad_time", "oversize")


def synthetic(
    count: int,
    hosts: int = 10,
    seed: int = 1,
    start: datetime | None = None,
    broken_every: int = 0,
    max_record_bytes: int = 64 * 1024,
) -> Iterator[bytes]:
    """`count` records; event time advances 10 ms per record from `start`. With
    `broken_every=N`, every Nth record is broken, cycling through BROKEN_KINDS."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not secrets
    start = start or datetime(2026, 1, 1, tzinfo=UTC)
    broken = 0
    for i in range(count):
        ts = start + timedelta(milliseconds=10 * i)
        record = {
            "host": f"host-{rng.randrange(hosts):03d}",
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z",
            "cpu_user": round(rng.uniform(0, 100), 2),
            "cpu_system": round(rng.uniform(0, 30), 2),
            "mem_used_mb": rng.randrange(256, 32_768),
            "mem_free_mb": rng.randrange(0, 16_384),
        }
        if broken_every and (i + 1) % broken_every == 0:
            yield break_record(record, BROKEN_KINDS[broken % len(BROKEN_KINDS)], max_record_bytes)
            broken += 1
        else:
            yield json.dumps(record).encode()


def break_record(record: dict[str, object], kind: str, max_record_bytes: int) -> bytes:
    """A record the pipeline must reject with a reason starting with `kind`."""
    if kind == "not_json":
        return json.dumps(record).encode()[:-3]
    if kind == "missing_field":
        return json.dumps({k: v for k, v in record.items() if k != "mem_free_mb"}).encode()
    if kind == "wrong_type":
        return json.dumps({**record, "cpu_user": str(record["cpu_user"])}).encode()
    if kind == "bad_time":
        return json.dumps({**record, "ts": "22/11/2026 10:00"}).encode()
    if kind == "oversize":
        return json.dumps({**record, "padding": "x" * max_record_bytes}).encode()
    raise ValueError(f"unknown broken kind {kind!r}; one of {BROKEN_KINDS}")


def from_file(path: Path) -> Iterator[bytes]:
    """JSONL (one object per line, sent as is) or CSV with a header naming the fields
    (numbers converted to the field's type; a bad value is sent as text, so the pipeline
    dead-letters it with its reason rather than the tool dropping it)."""
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        with path.open("rb") as lines:
            for line in lines:
                if line.strip():
                    yield line.rstrip(b"\r\n")
        return
    if path.suffix.lower() != ".csv":
        raise ValueError(f"{path}: want .csv or .jsonl, got {path.suffix or 'no suffix'}")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [f for f in FIELDS if f not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: CSV header lacks {', '.join(missing)}")
        for row in reader:
            yield json.dumps({k: _typed(k, v) for k, v in row.items() if k in FIELDS}).encode()


def _typed(field: str, text: str) -> object:
    types = FIELDS[field]
    try:
        if int in types and float not in types:
            return int(text)
        if float in types:
            return float(text)
    except ValueError:
        return text
    return text


@dataclass
class Progress:
    sent: int = 0
    acked: int = 0
    failed: int = 0
    started: float = 0.0

    def line(self, total: int | None, now: float) -> str:
        rate = self.acked / max(now - self.started, 1e-9)
        of = f"/{total}" if total is not None else ""
        return (
            f"published {self.acked}{of} acked ({self.sent} sent, {self.failed} failed), "
            f"{rate:,.0f}/s"
        )


def publish(
    settings: Settings,
    records: Iterable[bytes | None],
    rate: float = 0.0,
    total: int | None = None,
    on_progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Progress:
    """Produce `records` to the inbound topic with acks=all at `rate` per second (0: as
    fast as possible). Raises if any record is not acknowledged."""
    progress = Progress(started=clock())
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is None:
            progress.acked += 1
        else:
            progress.failed += 1
            errors.append(err)

    producer = Producer(
        producer_config(
            settings,
            # Paced sends at the default 5 ms linger made one acks=all request per record
            # or two: at 1,000 records/s librdkafka's broker thread took about 0.65 of a
            # core (9.6 s of CPU for 15 s of load) and the brokers a share more, on the
            # cores the engines under test need. 50 ms batches cost 1.5 s for the same
            # load; the wait is part of the end-to-end latency, as with any batching
            # upstream producer.
            **{"linger.ms": FEEDER_LINGER_MS},
        )
    )
    last_report = progress.started
    try:
        for value in records:
            while True:
                try:
                    producer.produce(settings.inbound_topic, value=value, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.1)  # local queue full: wait for acks
            progress.sent += 1
            producer.poll(0)
            now = clock()
            if rate > 0:
                ahead = progress.started + progress.sent / rate - now
                if ahead > 0:
                    sleep(ahead)
            if on_progress is not None and now - last_report >= 1.0:
                last_report = now
                on_progress(progress.line(total, now))
    finally:
        remaining = producer.flush(60)
    if on_progress is not None:
        on_progress(progress.line(total, clock()))
    if remaining or errors:
        raise RuntimeError(
            f"{remaining} records unacknowledged, {len(errors)} failed"
            + (f" (first error: {errors[0]})" if errors else "")
        )
    return progress
