"""The payments example's logic in plain Python: one card's last 10 minutes of payments
in event time, and whether a payment passes the spend limit or the velocity limit.

Deterministic in msg_id order (the contract's rule): the window holds the card's payments
whose event time is within 10 minutes of the newest one seen, so the verdict for a payment
depends only on the card's payments before it in the topic, never on batch boundaries or
the wall clock. A payment that arrives late (its time older than the window) still counts
against the window as it stands, and is not kept.
"""

from __future__ import annotations

from dataclasses import dataclass

WINDOW_MS = 10 * 60 * 1000
# An alert when the card's spend over the window passes this (in the payment's currency
# units; the example keeps one currency per card), or its count passes VELOCITY.
SPEND_LIMIT = 5_000.0
VELOCITY = 5

SCHEMA = (
    "payment_id STRING, card STRING, merchant STRING, amount DOUBLE, currency STRING, ts STRING"
)


@dataclass(frozen=True)
class Alert:
    rule: str  # "spend_limit" or "velocity"
    spend_10m: float
    payments_10m: int


def check(
    window: list[tuple[int, float]], ts_ms: int, amount: float
) -> tuple[list[tuple[int, float]], Alert | None]:
    """The card's window after this payment, and the alert it raises, if any. `window`:
    (event time, amount) of the card's recent payments, oldest first."""
    newest = max([ts_ms, *(t for t, _ in window)])
    kept = [(t, a) for t, a in window if t > newest - WINDOW_MS]
    late = ts_ms <= newest - WINDOW_MS
    current = [*kept, (ts_ms, amount)] if not late else kept
    spend = round(sum(a for _, a in current) + (amount if late else 0.0), 2)
    count = len(current) + (1 if late else 0)
    alert = None
    if spend > SPEND_LIMIT:
        alert = Alert("spend_limit", spend, count)
    elif count > VELOCITY:
        alert = Alert("velocity", spend, count)
    return sorted(current), alert
