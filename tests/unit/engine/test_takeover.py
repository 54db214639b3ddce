"""An engine's takeover and the repair of the gap it finds (twinstream.engine.takeover), with
fake clients: the win fences with the publisher prepared ahead and prepares the next; a gap
known at the win is planned on the election's thread and rewound by the main loop at once,
without waiting for the batch in flight; a rewind that fails reports the range."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from unittest import mock

from twinstream.core.checkpoint import RewindPoint
from twinstream.engine.app import Engine


def committed_batches(checkpoint: Path, topic: str, ends: dict[int, int]) -> None:
    for log in ("offsets", "commits"):
        (checkpoint / log).mkdir(parents=True, exist_ok=True)
    for batch, end in ends.items():
        (checkpoint / "offsets" / str(batch)).write_text(
            f"v1\n{{}}\n{json.dumps({topic: {'0': end}})}"
        )
        (checkpoint / "commits" / str(batch)).write_text("v1\n{}")


def won(engine: Engine, last_published: dict[int, int]) -> Any:
    """Prepare the spare publisher, as `open` does, and win at epoch 4."""
    clients: Any = engine.clients
    clients.last_published.return_value = last_published
    spare = clients.publisher.return_value
    engine.takeover.prepare_publisher()
    engine.gate.joined()
    engine.takeover.take_over(4)
    return spare


def test_a_win_fences_with_the_publisher_prepared_ahead_and_prepares_the_next(engine) -> None:
    engine.gate.on_batch(1, [])
    spare = won(engine, {0: 9})
    spare.fence.assert_called_once()
    assert engine.gate.role == "active"
    assert engine.recent.snapshot()["takeovers"][0]["epoch"] == 4
    deadline = time.monotonic() + 5
    while engine.clients.publisher.call_count < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.clients.publisher.call_count == 2
    assert not engine.takeover.due()


def test_a_gap_known_at_the_win_is_rewound_by_the_main_loop_at_once(engine, monkeypatch) -> None:
    """An engine back after both were killed holds nothing and its checkpoint went on past
    what was published: the takeover plans the repair, the main loop stops the query
    without waiting for the batch in flight, rewinds and restarts it."""
    checkpoint = engine.settings.checkpoint_dir("a")
    committed_batches(checkpoint, engine.settings.inbound_topic, {5: 100, 6: 200, 7: 300, 8: 400})
    stops: list[float] = []
    restarts: list[bool] = []
    monkeypatch.setattr(engine, "_stop_query_between_batches", stops.append)
    monkeypatch.setattr(engine, "_restart_query", lambda: restarts.append(True))
    engine.watermarks.log_starts.return_value = {0: 0}
    won(engine, {0: 249})
    assert engine.takeover.plan == RewindPoint(6, {0: 200})
    engine.check_query()  # the main loop's second
    assert stops == [0.0]
    assert restarts == [True]
    assert not engine.takeover.due()
    assert engine.gate.status().repairs[0].first == 250


def test_a_rewind_that_fails_reports_the_range_as_uncovered(engine, monkeypatch, caplog) -> None:
    checkpoint = engine.settings.checkpoint_dir("a")
    committed_batches(checkpoint, engine.settings.inbound_topic, {5: 100, 6: 200, 7: 300})
    monkeypatch.setattr(engine, "_restart_query", mock.MagicMock())
    engine.watermarks.log_starts.return_value = {0: 0}
    won(engine, {0: 249})
    stop = mock.MagicMock(side_effect=RuntimeError("disk gone"))
    engine.takeover.rewind(stop)
    assert "rewinding for the repair failed" in caplog.text
    assert [(u.first, u.last) for u in engine.gate.status().uncovered_ranges] == [(250, 299)]
