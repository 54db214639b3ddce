"""The payments example's Keyed step without Spark: a card's window moves on in event time,
alerts come at the limits to the cent, a late payment counts without being kept, and the
sample gives the same alerts whatever the batches. (Its validation and its bytes against
the first version: tests/integration/test_contract.py.)"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from pipelines.payments.generate import payments
from pipelines.payments.logic import WINDOW_MS
from pipelines.payments.pipeline import per_card, pipeline
from twinstream.contract import Reject
from twinstream.testing import keyed

START_MS = 1_772_323_200_000  # 2026-03-01T00:00:00Z


def record(msg_id: int, amount: float, at_ms: int, card: str = "card-1") -> dict[str, Any]:
    """A valid record as the step receives it: the members, the derived ts_ms, msg_id."""
    return {
        "msg_id": msg_id,
        "payment_id": f"p-{msg_id}",
        "card": card,
        "merchant": None,
        "amount": amount,
        "currency": "EUR",
        "ts": f"t+{at_ms}",
        "ts_ms": START_MS + at_ms,
    }


def alerts(records: list[dict[str, Any]], batches: int = 1) -> dict[int, Any]:
    """msg_id -> (rule, spend_10m, payments_10m) of each alert, None for no alert."""
    outcome = keyed.run(pipeline, records, batches=batches)
    found: dict[int, Any] = {}
    for msg_id, (kind, rows) in outcome.records.items():
        assert kind in ("out", "none"), (msg_id, kind, rows)
        found[msg_id] = (
            (rows[0]["rule"], rows[0]["spend_10m"], rows[0]["payments_10m"]) if rows else None
        )
    return found


def test_alerts_come_past_the_limits_to_the_cent_and_name_the_payment():
    got = alerts(
        [
            record(0, 2500.0, 0),
            record(1, 2500.0, 1_000),  # 5000.00: not past the limit
            record(2, 0.01, 2_000),  # 5000.01
            *(record(3 + i, 0.01, 60_000 + i, card="card-2") for i in range(6)),
        ]
    )
    assert got[1] is None
    assert got[2] == ("spend_limit", 5000.01, 3)
    assert [got[3 + i] for i in range(5)] == [None] * 5  # five in the window: no alert
    assert got[8] == ("velocity", 0.06, 6)
    outcome = keyed.run(pipeline, [record(0, 6000.0, 0)])
    assert outcome.outputs() == [
        {
            "msg_id": 0,
            "payment_id": "p-0",
            "card": "card-1",
            "rule": "spend_limit",
            "amount": 6000.0,
            "spend_10m": 6000.0,
            "payments_10m": 1,
            "ts": "t+0",
        }
    ]


def test_the_window_keeps_10_minutes_of_event_time_and_a_late_payment_is_not_kept():
    records = [
        record(0, 3000.0, 0),
        record(1, 1000.0, WINDOW_MS - 1),
        record(2, 1000.0, WINDOW_MS),  # the first is out: 2000.0
        record(3, 3000.01, WINDOW_MS + 1),  # 5000.01 with the two before
        record(4, 4000.0, 3 * WINDOW_MS),  # alone
        record(5, 1000.01, 0),  # late: counts against the window, 5000.01
        record(6, 900.0, 3 * WINDOW_MS + 1),  # the late one was not kept: 4900.0
    ]
    got = alerts(records)
    assert got[2] is None
    assert got[3] == ("spend_limit", 5000.01, 3)
    assert got[5] == ("spend_limit", 5000.01, 2)
    assert got[6] is None
    state = keyed.run(pipeline, records).states[0]["card-1"]
    assert state == ((START_MS + 3 * WINDOW_MS, START_MS + 3 * WINDOW_MS + 1), (4000.0, 900.0))


def test_the_sample_gives_the_same_alerts_in_any_batches_and_keeps_each_window_in_order():
    records = []
    for msg_id, raw in enumerate(payments(1500, seed=3)):
        fields = json.loads(raw)
        at = datetime.fromisoformat(fields["ts"])
        records.append({"msg_id": msg_id, **fields, "ts_ms": round(at.timestamp() * 1000)})
    whole = alerts(records)
    assert alerts(records, batches=17) == whole
    rules = {a[0] for a in whole.values() if a is not None}
    assert rules == {"spend_limit", "velocity"}
    # keyed.run checks each state is a tuple of STATE's two fields; each is in time order.
    for times, amounts in keyed.run(pipeline, records).states[0].values():
        assert len(times) == len(amounts) > 0
        assert list(times) == sorted(times)
        assert times[-1] - times[0] < WINDOW_MS


def test_the_derived_time_may_come_as_a_float_and_never_as_null():
    """pandas gives ts_ms as a float when a NULL (an invalid record's) shared its column."""
    as_float = {**record(0, 6000.0, 0), "ts_ms": float(START_MS)}
    state, alert = per_card(None, as_float)
    assert state == ((START_MS,), (6000.0,))
    assert isinstance(state[0][0], int)
    assert alert is not None
    with pytest.raises(Reject, match=r"^bad_time: "):
        per_card(state, {**record(1, 1.0, 0), "ts_ms": None})
