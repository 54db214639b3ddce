"""The admin API's contract with a fake engine: auth on everything but /healthz, JSON
errors with a reason, 409 where a request does not fit the engine's state."""

import pytest
from fastapi.testclient import TestClient

from twinstream.admin_api import Conflict, PipelineInfo, ServerInfo, create_app

TOKEN = "s3cret-token"


class FakeControl:
    def __init__(self):
        self.state = "running"

    def server_info(self):
        return ServerInfo(
            engine_id="a", role="standby", pid=1, zk_state="CONNECTED", epoch=3, version="0"
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
            uncovered_ranges=[(3, 4)],
        )

    def start_pipeline(self):
        if self.state == "running":
            raise Conflict("the pipeline is already running")
        self.state = "running"

    def stop_pipeline(self):
        if self.state != "running":
            raise Conflict("the pipeline is not running")
        self.state = "stopped"

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
    assert client.get("/pipeline", headers=AUTH).json()["uncovered_ranges"] == [[3, 4]]
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
