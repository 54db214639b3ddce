"""Fakes shared by unit tests."""

from typing import Any

from twinstream.admin_api import PipelineInfo, ServerInfo


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
