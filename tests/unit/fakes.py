"""Fakes shared by unit tests."""

from typing import Any
from unittest import mock

from twinstream.engine.api import AgreementInfo, BufferedRow, Difference, PipelineInfo, ServerInfo
from twinstream.engine.clients import EngineClients


class FakeClock:
    """A monotonic clock that only moves when a test or the code under test sleeps: call
    it, or use it as a `time` module (`monotonic`, `sleep`)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def engine_clients() -> EngineClients:
    """An engine's clients, every one a mock that reaches no network: the election's is
    `clients.election.return_value`, a publisher `clients.publisher.return_value`."""
    return EngineClients(
        zk=mock.MagicMock(name="zk"),
        election=mock.MagicMock(name="Election"),
        ensure_chroot=mock.MagicMock(name="ensure_chroot"),
        watermarks=mock.MagicMock(name="watermarks"),
        arrival_marks=mock.MagicMock(name="arrival_marks"),
        last_published=mock.MagicMock(name="last_published"),
        active_position=mock.MagicMock(name="active_position"),
        follower=mock.MagicMock(name="follower"),
        publisher=mock.MagicMock(name="KafkaPublisher"),
        published_rows=mock.MagicMock(name="published_rows", return_value=[]),
    )


def server_info(**fields: Any) -> ServerInfo:
    """GET /server as the admin API's model, with defaults for what a test leaves out."""
    base: dict[str, Any] = {
        "engine_id": "a",
        "role": "standby",
        "pid": 1,
        "zk_state": "CONNECTED",
        "epoch": 0,
        "version": "test",
    }
    return ServerInfo(**{**base, **fields})


def pipeline_info(**fields: Any) -> PipelineInfo:
    """GET /pipeline as the admin API's model, with defaults for what a test leaves out."""
    base: dict[str, Any] = {
        "state": "running",
        "reason": "",
        "last_msg_id_processed": None,
        "last_msg_id_published": None,
        "lag": None,
        "buffer_fill": 0,
        "buffer_size": 10,
        "in_sync": False,
        "uncovered_ranges": [],
    }
    return PipelineInfo(**{**base, **fields})


def timeline(now: float = 1_000.0, **fields: Any) -> dict[str, Any]:
    """An engine's GET /timeline as `twinstream.engine.timeline.Timeline.snapshot()` gives it: two
    buckets and one takeover unless a test says otherwise."""
    base: dict[str, Any] = {
        "window_s": 900.0,
        "step_s": 5.0,
        "now": now,
        "points": [
            {
                "t": now - 10,
                "p50_s": 0.4,
                "p99_s": 0.9,
                "published": 500,
                "in_per_s": 100.0,
                "lag": 20,
            },
            {
                "t": now - 5,
                "p50_s": None,
                "p99_s": None,
                "published": 0,
                "in_per_s": 100.0,
                "lag": None,
            },
        ],
        "takeovers": [{"t": now - 8, "epoch": 3}],
    }
    return {**base, **fields}


def disagreement(
    partition: int = 0, msg_id: int = 1000, overridden: bool = False
) -> dict[str, Any]:
    """GET /pipeline's `agreement` of a standby whose rows of msg_id 1000 differ from the
    active's transaction 950..1040 at epoch 3 (partition 0 unless told)."""
    return AgreementInfo(
        state="disagrees",
        checked={partition: msg_id - 51},
        ranges_agreed=12,
        difference=Difference(
            partition=partition,
            msg_id=msg_id,
            first=msg_id - 50,
            last=msg_id + 40,
            epoch=3,
            active_rows=[BufferedRow(msg_id=msg_id, kind="out", key="h1", value='{"avg": 0.5}')],
            engine_rows=[BufferedRow(msg_id=msg_id, kind="out", key="h1", value='{"avg": 0.7}')],
            found_at="2026-11-28T02:00:00+00:00",
        ),
        overridden=overridden,
    ).model_dump()
