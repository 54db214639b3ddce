"""What an engine does when its streaming query dies.

Guarantee: a failure traced to a batch's records (its processing raised while Kafka
answers) never stops the pipeline: the batch is split until one record is left, that
record is run alone again to confirm, then quarantined through ZooKeeper so that every
engine sets it aside and dead-letters it (twinstream.core.quarantine). Any other failure
restarts the query with backoff (2, 4, 8, .. 30 s); after three in a row the engine leaves
the election, so that a healthy standby takes over, and rejoins once its query runs.
Nothing here touches the query or the election itself: the engine applies the outcome.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twinstream.core.checkpoint import narrow_batch
from twinstream.core.logs import EngineLog
from twinstream.core.quarantine import (
    Bisection,
    QuarantineStore,
    failed_batch,
    next_step,
    quarantine_reason,
)
from twinstream.core.rows import record_text
from twinstream.platform.settings import CommonSettings

log = logging.getLogger(__name__)

# Consecutive failures not traced to a record before the engine leaves the election.
LEAVE_AFTER = 3


@dataclass(frozen=True)
class Outcome:
    """How the engine goes on: its reason (state `recovering`), whether to restart the
    query at once (a search step) or once the backoff is over, and whether to leave the
    election meanwhile."""

    reason: str
    restart_now: bool
    leave_election: bool


class Recovery:
    """One engine's record of failures: the quarantined offsets its query excludes, the
    search for the offending record of a failed batch and the batch size it imposes, and
    the backoff of failures no record explains."""

    def __init__(
        self,
        settings: CommonSettings,
        engine_id: str,
        quarantine: QuarantineStore,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.engine_id = engine_id
        self._log = EngineLog(log, engine_id, settings.pipeline)
        self.quarantine = quarantine
        self.clock = clock
        # The quarantined offsets the running query excludes (offset -> reason).
        self.excluded: dict[int, str] = {}
        self.search: Bisection | None = None
        # Set by a batch whose processing raised: (batch id, "<class>: <message>").
        self.batch_error: tuple[int, str] | None = None
        # Consecutive failures not traced to a record, and when to restart next.
        self.failures = 0
        self.restart_at = 0.0

    def batch_passed(self) -> None:
        self.failures = 0  # "in a row": a batch went through

    def backoff_over(self) -> bool:
        return self.clock() >= self.restart_at

    def query_died(
        self,
        error: Any,
        kafka_answers: Callable[[], bool],
        quarantined: Callable[[], dict[int, str]],
    ) -> Outcome:
        """A query died with `error`. Its batch's records are the suspects if the batch
        raised while Kafka answers: take the search's next step. Otherwise back off."""
        batch_error, self.batch_error = self.batch_error, None
        checkpoint = self.settings.checkpoint_dir(self.engine_id)
        failed = failed_batch(checkpoint, self.settings.inbound_topic)
        if batch_error is not None and failed is not None and kafka_answers():
            self.failures = 0
            step, self.search = next_step(failed, quarantined(), self.excluded, self.search)
            self._log.error(
                "batch %s (%s) failed: %s; %s",
                failed.batch_id,
                failed.describe(),
                batch_error[1],
                {
                    "exclude": "excluding the records another engine quarantined",
                    "split": f"running it again on half its suspects ({step.ends})",
                    "retry": "running the record alone again to confirm",
                    "quarantine": f"quarantining msg_id {record_text(step.record)}",
                }[step.action],
            )
            if step.action == "split" and step.ends is not None:
                narrow_batch(checkpoint, failed.batch_id, self.settings.inbound_topic, step.ends)
            elif step.action == "quarantine" and step.record is not None:
                reason = self.quarantine.add(
                    step.record, quarantine_reason(batch_error[1]), self.engine_id
                )
                self._log.error(
                    "msg_id %s QUARANTINED (%s): it goes to %s",
                    record_text(step.record),
                    reason,
                    self.settings.dlq_topic,
                )
                self.search = None
            self.restart_at = 0.0
            return Outcome(f"batch failed: {batch_error[1]}", True, False)
        self.failures += 1
        delay = min(30.0, 2.0**self.failures)
        first_line = str(error).splitlines()[0] if error is not None else "no error reported"
        reason = f"streaming query stopped: {first_line}; restarting in {delay:.0f} s"
        self.restart_at = self.clock() + delay
        self._log.error(
            "%s (failure %s in a row)",
            reason,
            self.failures,
        )
        return Outcome(reason, False, self.failures >= LEAVE_AFTER)

    def restart_failed(self, exc: BaseException) -> str:
        """Starting the query raised: the reason, with the next try after the backoff."""
        self.failures += 1
        delay = min(30.0, 2.0**self.failures)
        self.restart_at = self.clock() + delay
        reason = f"restarting the query failed: {exc}; again in {delay:.0f} s"
        self._log.error("%s", reason)
        return reason
