"""The admin API's contract with a fake engine: auth on everything but /healthz, JSON
errors with a reason, 409 where a request does not fit the engine's state."""

import pytest
from fastapi.testclient import TestClient

from twinstream.admin_api import (
    BufferedRow,
    Conflict,
    PipelineInfo,
    RestoreReport,
    ServerInfo,
    UncoveredRange,
    create_app,
)
from twinstream.snapshot import Manifest, SnapshotError

TOKEN = "s3cret-token"


MANIFEST = Manifest(
    snapshot_id="20261122T000000.000000Z-a-b7",
    pipeline="hostmetrics",
    engine_id="a",
    pipeline_version="0",
    next_offset=70,
    batch_id=7,
    created_at="2026-11-22T00:00:00+00:00",
    size_bytes=10,
    buffer_rows=1,
    buffer_last_msg_id=69,
    files={"buffer.jsonl": "0" * 64},
)


class FakeControl:
    def __init__(self):
        self.state = "running"
        self.role = "standby"

    def server_info(self):
        return ServerInfo(
            engine_id="a", role=self.role, pid=1, zk_state="CONNECTED", epoch=3, version="0"
        )

    def pipeline_info(self):
        return PipelineInfo(
            state=self.state,
            reason="",
            last_msg_id_processed=10,
            last_msg_id_published=None,
            lag=0,
            buffer_fill=11,
            buffer_size=100,
            in_sync=True,
            uncovered_ranges=[UncoveredRange(partition=0, first=3, last=4)],
        )

    def start_pipeline(self):
        if self.state == "running":
            raise Conflict("the pipeline is already running")
        self.state = "running"

    def stop_pipeline(self):
        if self.state != "running":
            raise Conflict("the pipeline is not running")
        self.state = "stopped"

    def persist(self) -> Manifest:
        if self.role == "active":
            raise Conflict("this engine is the active")
        return MANIFEST

    def restore(self, requested: str) -> RestoreReport:
        if self.state != "stopped":
            raise Conflict("stop the pipeline first")
        if requested != MANIFEST.snapshot_id:
            raise SnapshotError(f"no snapshot {requested}")
        self.state = "restoring"
        return RestoreReport(
            snapshot=requested, next_offset=70, log_start_offset=0, pipeline=self.pipeline_info()
        )

    def buffer_tail(self, last: int) -> list[BufferedRow]:
        rows = [BufferedRow(msg_id=i, kind="out", key="h", value="{}") for i in range(60, 70)]
        return rows[-last:]

    def metrics(self):
        return b"twinstream_role 1\n"


@pytest.fixture
def client():
    return TestClient(create_app(FakeControl(), TOKEN), raise_server_exceptions=False)


PROTECTED = [
    ("GET", "/server"),
    ("GET", "/pipeline"),
    ("POST", "/pipeline/stop"),
    ("POST", "/pipeline/start"),
    ("POST", "/pipeline/persist"),
    ("POST", "/pipeline/restore"),
    ("GET", "/pipeline/buffer"),
    ("GET", "/metrics"),
]
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_healthz_needs_no_token(client):
    assert client.get("/healthz").json() == {"ok": True}


@pytest.mark.parametrize(("method", "path"), PROTECTED)
@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "missing bearer token"),
        ({"Authorization": "Bearer nope"}, "wrong bearer token"),
        ({"Authorization": f"Basic {TOKEN}"}, "missing bearer token"),
        ({"Authorization": f"Bearer {TOKEN}x"}, "wrong bearer token"),
    ],
)
def test_every_other_endpoint_rejects_a_missing_or_wrong_token(
    client, method, path, headers, reason
):
    response = client.request(method, path, headers=headers)
    assert response.status_code == 401
    assert (
        response.json() == {"reason": reason.split(" (")[0]} or reason in response.json()["reason"]
    )
    assert reason in response.json()["reason"]
    assert "Traceback" not in response.text


def test_the_right_token_gets_status_and_control(client):
    assert client.get("/server", headers=AUTH).json()["role"] == "standby"
    assert client.get("/pipeline", headers=AUTH).json()["uncovered_ranges"] == [
        {"partition": 0, "first": 3, "last": 4}
    ]
    assert client.get("/metrics", headers=AUTH).text == "twinstream_role 1\n"
    assert client.post("/pipeline/stop", headers=AUTH).json()["state"] == "stopped"
    again = client.post("/pipeline/stop", headers=AUTH)
    assert again.status_code == 409
    assert again.json() == {"reason": "the pipeline is not running"}
    assert client.post("/pipeline/start", headers=AUTH).json()["state"] == "running"


def test_an_internal_error_is_json_with_a_reason_not_a_stack_trace():
    control = FakeControl()
    control.pipeline_info = lambda: 1 / 0  # type: ignore[method-assign]
    client = TestClient(create_app(control, TOKEN), raise_server_exceptions=False)
    response = client.get("/pipeline", headers=AUTH)
    assert response.status_code == 500
    assert response.json() == {"reason": "ZeroDivisionError: division by zero"}


def test_openapi_is_published_and_an_empty_token_is_refused(client):
    assert "/pipeline/stop" in client.get("/openapi.json").json()["paths"]
    with pytest.raises(ValueError, match="TWINSTREAM_ADMIN_TOKEN"):
        create_app(FakeControl(), "")


def test_persist_is_refused_on_the_active_with_a_reason():
    control = FakeControl()
    client = TestClient(create_app(control, TOKEN), raise_server_exceptions=False)
    assert client.post("/pipeline/persist", headers=AUTH).json()["next_offset"] == 70
    control.role = "active"
    refused = client.post("/pipeline/persist", headers=AUTH)
    assert refused.status_code == 409
    assert refused.json() == {"reason": "this engine is the active"}


def test_restore_needs_a_stopped_pipeline_and_a_usable_snapshot(client):
    body = {"snapshot": MANIFEST.snapshot_id}
    assert client.post("/pipeline/restore", headers=AUTH, json=body).status_code == 409
    client.post("/pipeline/stop", headers=AUTH)
    unknown = client.post("/pipeline/restore", headers=AUTH, json={"snapshot": "nope"})
    assert (unknown.status_code, unknown.json()) == (422, {"reason": "no snapshot nope"})
    bad = client.post("/pipeline/restore", headers=AUTH, json={"snapshot": "../../etc"})
    assert bad.status_code == 422
    assert bad.json()["reason"].startswith("invalid request: body.snapshot: String should")
    report = client.post("/pipeline/restore", headers=AUTH, json=body).json()
    assert report["snapshot"] == MANIFEST.snapshot_id
    assert report["pipeline"]["state"] == "restoring"


def test_buffer_returns_the_newest_rows(client):
    rows = client.get("/pipeline/buffer?last=3", headers=AUTH).json()
    assert [r["msg_id"] for r in rows] == [67, 68, 69]
    assert client.get("/pipeline/buffer?last=0", headers=AUTH).status_code == 422
