"""Per-user sessions on `Keyed` state: every valid record gives exactly one output or one
dead letter, so a test can hold each inbound offset to its row. Defined here, in the
tests, as a new user writes one: the contract and nothing else of the package.

Inbound: {"user": "u07919", "amount": 532, "ts": 1767225600000} (ts: epoch milliseconds)
Outbound (key: the user): {"user": "u07919", "n": 2, "total": 1064, "since": 1767225600000},
the user's session so far: its records, their total and when it began. A session ends
when its user has been idle for `IDLE_MS` of event time (`Keyed.expire_after_ms`): the
next record begins a new one. A record that would take a session's total over `LIMIT` is
its own dead letter (`over_limit: ...`, the session unchanged); an amount below 1 is the
guard's (`Bound`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from twinstream.contract import Bound, Keyed, Pipeline, Reject

# 150 s of event time, 15,000 records of `sample` (10 ms apart): a busy user's session
# lasts, and about half of the rare users' second records begin a new one.
IDLE_MS = 150_000
LIMIT = 100_000
# The users `sample` cycles through (each once, in a scrambled order, before any repeats)
# and the few busy ones between them.
USERS = 20_000
HOT = 12
START_MS = 1_767_225_600_000
TICK_MS = 10


def step(
    state: tuple[int, int, int] | None, record: dict[str, Any]
) -> tuple[tuple[int, int, int], dict[str, Any]]:
    n, total, since = state if state is not None else (0, 0, record["ts"])
    amount = record["amount"]
    if total + amount > LIMIT:
        raise Reject(f"over_limit: {record['user']}'s session total {total} + {amount}")
    new = (n + 1, total + amount, since)
    return new, {"user": record["user"], "n": new[0], "total": new[1], "since": since}


def user(i: int, rng: random.Random) -> str:
    """The user of the i-th record: one in six a busy one; the others go through every one
    of `USERS` once (7919 is prime to 20,000: a permutation), then at random."""
    if i % 6 == 0:
        return f"hot{rng.randrange(HOT):02d}"
    cold = i - i // 6 - 1
    index = (cold * 7919) % USERS if cold < USERS else rng.randrange(USERS)
    return f"u{index:05d}"


def sample(count: int, seed: int, broken_every: int) -> Iterator[bytes]:
    """`count` records, 10 ms of event time apart; every `broken_every`-th (if not 0) has
    amount 0, which the guard dead-letters."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not secrets
    for i in range(count):
        amount = rng.randrange(1, 1000)
        if broken_every and (i + 1) % broken_every == 0:
            amount = 0
        record = {"user": user(i, rng), "amount": amount, "ts": START_MS + i * TICK_MS}
        yield json.dumps(record).encode()


pipeline = Pipeline(
    name="sessions",
    schema="user STRING, amount BIGINT, ts BIGINT",
    bounds={"amount": Bound(min=1)},
    keyed=Keyed(
        step=step,
        output="user STRING, n BIGINT, total BIGINT, since BIGINT",
        state="n BIGINT, total BIGINT, since BIGINT",
        expire_after_ms=IDLE_MS,
        event_time="ts",
    ),
    key="user",
    partition_by="user",
    value=["user", "n", "total", "since"],
    sample=sample,
)
