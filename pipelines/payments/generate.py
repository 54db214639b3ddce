"""Sample card payments: reproducible, with bursts that pass the limits now and then and,
if asked, broken records of each kind the pipeline rejects."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

BROKEN_KINDS = ("not_json", "missing_field", "wrong_type", "negative_amount", "bad_time")


def payments(count: int, seed: int = 1, broken_every: int = 0, cards: int = 36) -> Iterator[bytes]:
    """`count` payments, event time advancing 10 s per payment from 2026-01-01; one in
    five comes from one of four cards that spend often and large amounts, which is what
    raises most alerts (about one payment in ten)."""
    rng = random.Random(seed)  # noqa: S311 - reproducible sample data, not secrets
    start = datetime(2026, 1, 1, tzinfo=UTC)
    broken = 0
    for i in range(count):
        bursty = rng.random() < 0.2
        card = f"card-{rng.randrange(4) if bursty else 4 + rng.randrange(cards):04d}"
        ts = start + timedelta(seconds=10 * i)
        record = {
            "payment_id": f"p-{seed}-{i}",
            "card": card,
            "merchant": f"m-{rng.randrange(500)}",
            "amount": round(rng.uniform(900, 2500) if bursty else rng.lognormvariate(3, 1), 2),
            "currency": "EUR",
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z",
        }
        if broken_every and (i + 1) % broken_every == 0:
            kind = BROKEN_KINDS[broken % len(BROKEN_KINDS)]
            broken += 1
            if kind == "not_json":
                yield json.dumps(record).encode()[:-2]
                continue
            if kind == "missing_field":
                del record["card"]
            elif kind == "wrong_type":
                record["amount"] = str(record["amount"])
            elif kind == "negative_amount":
                record["amount"] = -abs(float(str(record["amount"])))
            else:
                record["ts"] = "yesterday"
        yield json.dumps(record).encode()
