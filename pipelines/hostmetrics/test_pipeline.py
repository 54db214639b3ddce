"""hostmetrics' own tests, beside its code: the step in plain Python (no Spark, no stack,
milliseconds). `twinstream deploy hostmetrics` runs them before it restarts anything.

    .venv/bin/pytest pipelines/hostmetrics
"""

from __future__ import annotations

import json
from typing import Any

from twinstream.testing import keyed

from .logic import WINDOW_SIZE
from .pipeline import pipeline


def reading(msg_id: int, host: str, second: int, cpu: float, mem: int) -> dict[str, Any]:
    return {
        "msg_id": msg_id,
        "host": host,
        "ts": f"2026-11-22T10:{second // 60:02d}:{second % 60:02d}.000Z",
        "cpu_user": cpu,
        "cpu_system": 1.0,
        "mem_used_mb": mem,
        "mem_free_mb": 100,
    }


def test_each_host_averages_its_last_events_and_a_bad_time_is_a_dead_letter() -> None:
    records = [reading(i, "web-1", i, float(i), 10) for i in range(WINDOW_SIZE + 2)]
    records.append(reading(len(records), "web-2", 0, 50.0, 7))
    bad = {**reading(len(records), "web-1", 0, 1.0, 1), "ts": "yesterday"}
    records.append(bad)
    outcome = keyed.run(pipeline, records)
    values = [json.loads(row["value"]) for row in outcome.outputs()]
    last_web1 = [v for v in values if v["host"] == "web-1"][-1]
    # The window holds the host's last WINDOW_SIZE events: 2 .. 21.
    assert last_web1["window_count"] == WINDOW_SIZE
    assert last_web1["cpu_user_avg20"] == sum(range(2, WINDOW_SIZE + 2)) / WINDOW_SIZE
    assert last_web1["mem_used_sum20"] == 10 * WINDOW_SIZE
    # Another host's window is its own.
    assert values[-1]["host"] == "web-2"
    assert values[-1]["window_count"] == 1
    kind, reason = outcome.records[bad["msg_id"]]
    assert (kind, reason) == ("dlq", "bad_time: 'yesterday' is not RFC 3339 UTC")


def test_the_output_does_not_depend_on_batch_boundaries() -> None:
    records = [reading(i, f"web-{i % 7}", i, float(i % 13), i % 5) for i in range(200)]
    assert keyed.run(pipeline, records, batches=9) == keyed.run(pipeline, records)
