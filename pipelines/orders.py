"""Orders -> one output row per order line: a fan-out (several outputs per input), and no
output at all for an order without lines. Stateless, in Spark SQL only; defined here, in
the tests, to prove that a pipeline needs nothing of the package but the contract.

Inbound: {"order_id": "o-1", "customer": "c-7", "lines": [{"sku": "s-3", "qty": 2}, ...]}
Outbound (key: the order): {"order_id": "o-1", "line": 0, "sku": "s-3", "qty": 2}
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING

from twinstream.contract import Pipeline

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def transform(records: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return records.select("msg_id", "order_id", F.posexplode("lines").alias("line", "item")).select(
        "msg_id", "order_id", "line", "item.sku", "item.qty"
    )


def sample(count: int, seed: int, broken_every: int) -> Iterator[bytes]:
    """Orders of 0 to 4 lines (one in five has none); every `broken_every`-th has a line
    whose quantity is 0, which the check rejects."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not secrets
    for i in range(count):
        lines = [
            {"sku": f"s-{rng.randrange(100)}", "qty": rng.randrange(1, 5)}
            for _ in range(rng.choice((0, 1, 1, 2, 4)))
        ]
        if broken_every and (i + 1) % broken_every == 0:
            lines.append({"sku": "s-0", "qty": 0})
        yield json.dumps(
            {"order_id": f"o-{seed}-{i}", "customer": f"c-{i % 7}", "lines": lines}
        ).encode()


pipeline = Pipeline(
    name="orders",
    schema="order_id STRING, customer STRING, lines ARRAY<STRUCT<sku: STRING, qty: INT>>",
    checks={"out_of_range: a line's qty is not positive": "forall(lines, l -> l.qty > 0)"},
    transform=transform,
    key="order_id",
    partition_by="order_id",
    value=["order_id", "line", "sku", "qty"],
    sample=sample,
)
