"""Card payments on the contract: zero or one alert per payment, per-card state.

Inbound value (JSON object)::

    {"payment_id": "p-1", "card": "card-0042", "merchant": "m-17", "amount": 1250.0,
     "currency": "EUR", "ts": "2026-01-01T10:00:00.000Z"}

Outbound, only for a payment that passes a limit (key: the card)::

    {"payment_id": "p-1", "card": "card-0042", "rule": "spend_limit", "amount": 1250.0,
     "spend_10m": 5310.5, "payments_10m": 4, "ts": "2026-01-01T10:00:00.000Z"}

Most payments raise nothing: the progress records account for them (the audit checks it).
The framework validates the schema, the `BOUNDS` (an amount above 0) and the `checks` (an
amount in cents, a time Spark cannot read is `bad_time`), and reads the time in the JVM;
Python keeps only the per-card window. The value is serialised by the framework
(`to_json`). The audit's expectations hold for everything the guard lets through: the
amount's from the same `BOUNDS`; `spend_10m >= amount` because every amount in a window is
above 0 and has at most two decimals, so the window's sum rounded to cents cannot fall
below the payment's own amount (`tests/integration/test_contract.py` runs it on edge cases).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from examples.payments.generate import payments
from examples.payments.logic import SCHEMA, check
from twinstream.contract import Bound, Pipeline

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.state import GroupState

OUTPUT = (
    "msg_id BIGINT, card STRING, payment_id STRING, rule STRING, amount DOUBLE, "
    "spend_10m DOUBLE, payments_10m BIGINT, ts STRING"
)
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
# The card's window as JSON text ([[ts_ms, amount], ...]): see hostmetrics for why not an
# ARRAY state field.
STATE = "window STRING"


def per_card(
    key: tuple[Any, ...], batches: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """One card's payments in msg_id order: an alert row for each that passes a limit,
    nothing for the rest."""
    import pandas as pd

    frame = pd.concat(list(batches), ignore_index=True).sort_values("msg_id")
    window = [(int(t), float(a)) for t, a in json.loads(state.get[0])] if state.exists else []
    out: list[dict[str, Any]] = []
    for p in frame.itertuples(index=False):
        window, alert = check(window, int(p.ts_ms), float(p.amount))
        if alert is not None:
            out.append(
                {
                    "msg_id": p.msg_id,
                    "card": key[0],
                    "payment_id": p.payment_id,
                    "rule": alert.rule,
                    "amount": float(p.amount),
                    "spend_10m": alert.spend_10m,
                    "payments_10m": alert.payments_10m,
                    "ts": p.ts,
                }
            )
    state.update((json.dumps(window),))
    columns = [c.split(" ")[0] for c in OUTPUT.split(", ")]
    yield pd.DataFrame(out, columns=columns).astype({"msg_id": "int64", "payments_10m": "int64"})


def transform(records: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    timed = records.select(
        "msg_id",
        "card",
        "payment_id",
        "amount",
        "ts",
        F.unix_millis(F.expr(TIME_TEXT)).alias("ts_ms"),
    )
    return timed.groupBy("card").applyInPandasWithState(
        per_card,
        outputStructType=OUTPUT,
        stateStructType=STATE,
        outputMode="append",
        # The window is cut by event time inside `check`, never by batch timing.
        timeoutConf=GroupStateTimeout.NoTimeout,
    )


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
    transform=transform,
    key="card",
    partition_by="card",
    value=["payment_id", "card", "rule", "amount", "spend_10m", "payments_10m", "ts"],
    expectations=expectations,
    value_schema=(
        "payment_id STRING, card STRING, rule STRING, amount DOUBLE, spend_10m DOUBLE, "
        "payments_10m BIGINT, ts STRING"
    ),
    sample=lambda count, seed, broken_every: payments(count, seed, broken_every),
    spark_conf={"spark.sql.session.timeZone": "UTC"},
    description=__doc__ or "",
)
