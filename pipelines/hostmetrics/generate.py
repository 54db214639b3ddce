"""Synthetic host metrics for the hostmetrics example: reproducible records, with optional
broken ones of every kind the pipeline rejects (`twinstream publish --pipeline hostmetrics
--synthetic N`, the tests' loads)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

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
        record = reading(f"host-{rng.randrange(hosts):03d}", start, i, rng)
        if broken_every and (i + 1) % broken_every == 0:
            yield break_record(record, BROKEN_KINDS[broken % len(BROKEN_KINDS)], max_record_bytes)
            broken += 1
        else:
            yield json.dumps(record).encode()


def reading(host: str, start: datetime, i: int, rng: random.Random) -> dict[str, object]:
    """The `i`-th reading from `start` (event time 10 ms apart), its figures drawn from
    `rng`: one shape for every generator of hostmetrics events."""
    ts = start + timedelta(milliseconds=10 * i)
    return {
        "host": host,
        "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z",
        "cpu_user": round(rng.uniform(0, 100), 2),
        "cpu_system": round(rng.uniform(0, 30), 2),
        "mem_used_mb": rng.randrange(256, 32_768),
        "mem_free_mb": rng.randrange(0, 16_384),
    }


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
