"""An engine's takeover and the repair of a gap it finds: the one place that coordinates them.

A takeover, in order (docs/design.md, "The failover protocol" and "Threads and locks"):

1. The election's thread calls `take_over(epoch)`: the gate fences with the publisher
   prepared ahead (`prepare_publisher`), reads where the published output ends (the
   `last_published` reader: a standby's periodic look uses another) and publishes what
   its buffer holds after it (`twinstream.core.gate.Gate.take_over`). A new spare
   publisher is prepared on a thread of its own: a fenced or used producer can serve no
   later takeover.
2. A range above the last published msg_id that the buffer does not cover: the gate, with
   its lock held, asks `on_gap`, which plans its recomputation
   (`twinstream.engine.persistence.repair_plan`: a checkpoint batch, else a snapshot) and
   only notes the plan. Found at the takeover itself (`Gate.resumes_at`: an engine that
   holds nothing yet), the query is stopped without finishing the batch in flight.
3. The engine's main loop, under the engine's lock, sees `due()` and calls `rewind`: the
   query stopped, its checkpoint rewound to the plan, the gate told where the query
   continues; the engine then restarts the query, and the gate publishes exactly the
   missing msg_ids before anything later. A rewind that fails reports the range as
   uncovered (`Gate.repair_failed`), and what follows is published.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from twinstream.core.checkpoint import resume_point
from twinstream.core.gate import Gate
from twinstream.core.logs import EngineLog
from twinstream.core.outbound import KafkaPublisher, LastPublishedReader
from twinstream.core.rows import positions_text
from twinstream.engine import persistence
from twinstream.engine.timeline import Timeline
from twinstream.platform.settings import CommonSettings


class Takeover:
    def __init__(
        self,
        settings: CommonSettings,
        engine_id: str,
        gate: Gate,
        last_published: LastPublishedReader,
        new_publisher: Callable[[], KafkaPublisher],
        log_starts: Callable[[], Mapping[int, int]],
        recent: Timeline,
        log: EngineLog,
        version: str = "",
    ) -> None:
        self._settings = settings
        # The code this engine runs: a gap is recomputed only from a snapshot of it.
        self._version = version
        self._engine_id = engine_id
        self._gate = gate
        self._last_published = last_published
        self._new_publisher = new_publisher
        self._log_starts = log_starts
        self._recent = recent
        self._log = log.named(__name__)
        # Built ahead of a takeover, so that winning costs only the fence and the tail read.
        self._spare: KafkaPublisher | None = None
        # A gap to recompute, found at a takeover: how (the main loop does it).
        self.plan: persistence.Plan | None = None
        # The repair was planned at a takeover, before the query's first batch: the batch in
        # flight holds only rows after the gap, so the query stops without finishing it.
        self._at_once = False

    def prepare_publisher(self) -> None:
        try:
            self._spare = self._new_publisher()
        except Exception as exc:  # a takeover builds one itself
            self._log.warning("could not prepare a publisher: %s", exc)
            self._spare = None

    def take_over(self, epoch: int) -> None:
        """The election's callback on a win (its thread): fence, publish from the buffer."""
        self._recent.takeover(epoch)
        spare, self._spare = self._spare, None

        def fence() -> KafkaPublisher:
            return (spare or self._new_publisher()).fence()

        try:
            self._gate.take_over(epoch, fence=fence, last_committed=self._last_published)
        finally:
            # A fenced or used producer can never serve a later takeover: build the next one.
            threading.Thread(
                target=self.prepare_publisher, name="spare-publisher", daemon=True
            ).start()
        # An engine back after both were killed holds nothing yet and its checkpoint went on
        # past what was published: the gap is known before any batch, so it is repaired now
        # and the batch in flight (all of it after the gap) is not waited for.
        # Said before the gate asks for the repair: the main loop may act on it at once.
        self._at_once = True
        self._at_once = self._gate.resumes_at(
            lambda: resume_point(
                self._settings.checkpoint_dir(self._engine_id), self._settings.inbound_topic
            )
        )

    def on_gap(self, partition: int, first: int, last: int) -> bool:
        """The gate found msg_id first..last of `partition` in no buffer at a takeover (its
        lock held). Plan to recompute it; the main loop rewinds. False: nothing reaches
        back to it."""
        plan = persistence.repair_plan(
            self._settings, self._engine_id, partition, first, self._log_starts, self._version
        )
        if plan is None:
            self._log.error(
                "msg_id %s..%s of partition %s cannot be recomputed: the checkpoint history "
                "and the snapshots begin after it, or Kafka no longer holds it",
                first,
                last,
                partition,
            )
            return False
        self.plan = plan
        return True

    def due(self) -> bool:
        """A repair is planned: the main loop rewinds before anything else."""
        return self.plan is not None

    def rewind(self, stop_query: Callable[[float], None]) -> None:
        """The main loop's part (the engine's lock held): stop the query (`stop_query`, given
        how long it may wait for the batch in flight), rewind its checkpoint to the plan and
        tell the gate where the query continues. The engine restarts the query after it."""
        plan, self.plan = self.plan, None
        at_once, self._at_once = self._at_once, False
        if plan is None:
            return
        try:
            self._gate.abandon_waits()
            stop_query(0.0 if at_once else 30.0)
            source, next_offsets = persistence.rewind(self._settings, self._engine_id, plan)
            self._gate.rewind(next_offsets)
            self._log.warning(
                "rewound to msg_id %s (%s) to recompute the gap",
                positions_text(next_offsets),
                source,
            )
        except Exception as exc:
            self._log.exception("rewinding for the repair failed")
            self._gate.repair_failed(f"{type(exc).__name__}: {exc}")
