"""Card payments on the contract: zero or one alert per payment, per-card state.

Inbound value (JSON object)::

    {"payment_id": "p-1", "card": "card-0042", "merchant": "m-17", "amount": 1250.0,
     "currency": "EUR", "ts": "2026-01-01T10:00:00.000Z"}

Outbound, only for a payment that passes a limit (key: the card)::

    {"payment_id": "p-1", "card": "card-0042", "rule": "spend_limit", "amount": 1250.0,
     "spend_10m": 5310.5, "payments_10m": 4, "ts": "2026-01-01T10:00:00.000Z"}

Most payments raise nothing: the progress records account for them (the audit checks it).
The framework validates the schema, the `BOUNDS` (an amount above 0) and the `checks` (an
amount in cents, a time Spark cannot read is `bad_time`), reads the time in the JVM
(`derive`) and keeps each card's window as the `Keyed` step `per_card` returns it: Python
only moves the window on. The value is serialised by the framework (`to_json`), so its
bytes are those of the first version of this example, which kept the window with
`applyInPandasWithState` (`tests/data/payments-golden.jsonl.gz`). The audit's expectations
hold for everything the guard lets through: the amount's from the same `BOUNDS`;
`spend_10m >= amount` because every amount in a window is above 0 and has at most two
decimals, so the window's sum rounded to cents cannot fall below the payment's own amount
(`tests/integration/test_contract.py` runs it on edge cases).
"""

from __future__ import annotations

from typing import Any

from pipelines.payments.generate import payments
from pipelines.payments.logic import SCHEMA, check
from twinstream.contract import Bound, Keyed, Pipeline, Reject

# Read in the JVM; UTC for a time without a zone (spark_conf below), so every engine reads
# the same instant. `try_`: a time that does not parse is NULL (the check), never an error.
TIME_TEXT = "try_to_timestamp(ts)"
BAD_TIME = f"{TIME_TEXT} IS NOT NULL AND ts rlike '(Z|[+-][0-9][0-9]:?[0-9][0-9])$'"
# What an amount may be: the guard's rule and the audit's expectation on the published
# amount, from one declaration.
BOUNDS = {"amount": Bound(min=0, strict_min=True)}
# The spend is rounded to cents (`check`): an amount with more would let the rounded spend
# fall below it (6000.004 alone gives a spend of 6000.0). Spark's round reads the double's
# shortest text, so an amount of two decimals or fewer equals its round exactly.
CENTS = "round(amount, 2) = amount"
# The alert: the output columns, of which the value is all but none (the key is the card).
OUTPUT = (
    "payment_id STRING, card STRING, rule STRING, amount DOUBLE, spend_10m DOUBLE, "
    "payments_10m BIGINT, ts STRING"
)
# The card's window, oldest first, as two columns of equal length: (event time, amount) of
# each payment `check` keeps. Floats and ints as they are: the sums, and so the bytes of
# every alert, are those of the window the first version kept.
STATE = "ts_ms ARRAY<BIGINT>, amount ARRAY<DOUBLE>"

Window = tuple[tuple[int, ...], tuple[float, ...]]


def per_card(state: Window | None, record: dict[str, Any]) -> tuple[Window, dict[str, Any] | None]:
    """`Keyed.step`: one payment through its card's window, in msg_id order; the alert it
    raises, or None. No expiry (`Keyed.expire_after_ms`): a late payment counts against the
    card's window however long the card has been idle (`check`), so forgetting a window
    would change the alerts that follow."""
    ts_ms = record["ts_ms"]
    if ts_ms is None:
        # The guard's `bad_time` check lets no such record through; a direct call (a unit
        # test of the step) gets the same reason.
        raise Reject("bad_time: ts is not an ISO 8601 time with its zone")
    amount = float(record["amount"])
    window = [] if state is None else list(zip(*state, strict=True))
    # ts_ms is a float when a NULL shared its batch's column (pandas): exact below 2^53 ms.
    kept, alert = check(window, int(ts_ms), amount)
    new_state: Window = (tuple(t for t, _ in kept), tuple(a for _, a in kept))
    if alert is None:
        return new_state, None
    return new_state, {
        "payment_id": record["payment_id"],
        "card": record["card"],
        "rule": alert.rule,
        "amount": amount,
        "spend_10m": alert.spend_10m,
        "payments_10m": alert.payments_10m,
        "ts": record["ts"],
    }


def expectations() -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectColumnValuesToBeInSet(column="rule", value_set=["spend_limit", "velocity"]),
        gxe.ExpectColumnValuesToNotBeNull(column="payment_id"),
        gxe.ExpectColumnValuesToBeBetween(column="payments_10m", min_value=1),
        BOUNDS["amount"].expectation("amount"),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="spend_10m", column_B="amount", or_equal=True
        ),
    ]


pipeline = Pipeline(
    name="payments",
    schema=SCHEMA,
    # A transfer or a cash withdrawal has no merchant: the member may be absent or null.
    optional=("merchant",),
    bounds=BOUNDS,
    checks={
        "out_of_range: amount has more than two decimals": CENTS,
        "wrong_type: currency is not an ISO 4217 code": "currency rlike '^[A-Z]{3}$'",
        "wrong_type: card is empty": "card <> ''",
        "bad_time: ts is not an ISO 8601 time with its zone": BAD_TIME,
    },
    # Per card, in msg_id order: the window moves on, an alert when a limit is passed.
    keyed=Keyed(
        step=per_card,
        output=OUTPUT,
        state=STATE,
        # The time as the first version read it: Spark's parse, epoch milliseconds.
        derive={"ts_ms": f"unix_millis({TIME_TEXT})"},
    ),
    key="card",
    partition_by="card",
    value=["payment_id", "card", "rule", "amount", "spend_10m", "payments_10m", "ts"],
    expectations=expectations,
    value_schema=OUTPUT,
    sample=lambda count, seed, broken_every: payments(count, seed, broken_every),
    spark_conf={"spark.sql.session.timeZone": "UTC"},
    description=__doc__ or "",
)
