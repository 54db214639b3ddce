"""The admin API's contract with a fake engine: auth on everything but its public pages
(/healthz, /openapi.json, /docs), JSON errors with a reason, 409 where a request does not
fit the engine's state; and over https, served by a real uvicorn with a throwaway CA's
certificate on 127.0.0.1 (no other service), as EngineClient reaches it."""

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.routing import Route

from tests.unit import fakes
from twinstream.engine.api import (
    BufferedRow,
    Conflict,
    PipelineInfo,
    RestoreReport,
    ServerInfo,
    TimelineInfo,
    UncoveredRange,
    create_app,
    public_paths,
)
from twinstream.engine.client import EngineClient, EngineError
from twinstream.engine.snapshot import Manifest, SnapshotError
from twinstream.platform.settings import REPO_ROOT, Settings, load_settings
from twinstream.stack.tls import TlsFiles, ensure_tls

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


class FakeEngine:
    engine_id = "a"

    def __init__(self):
        self.state = "running"
        self.role = "standby"

    def server(self) -> ServerInfo:
        return ServerInfo(
            engine_id="a", role=self.role, pid=1, zk_state="CONNECTED", epoch=3, version="0"
        )

    def pipeline(self) -> PipelineInfo:
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

    def start(self) -> PipelineInfo:
        if self.state == "running":
            raise Conflict("the pipeline is already running")
        self.state = "running"
        return self.pipeline()

    def stop(self) -> PipelineInfo:
        if self.state != "running":
            raise Conflict("the pipeline is not running")
        self.state = "stopped"
        return self.pipeline()

    def persist(self) -> Manifest:
        if self.role == "active":
            raise Conflict("this engine is the active")
        return MANIFEST

    def restore(self, snapshot: str) -> RestoreReport:
        if self.state != "stopped":
            raise Conflict("stop the pipeline first")
        if snapshot != MANIFEST.snapshot_id:
            raise SnapshotError(f"no snapshot {snapshot}")
        self.state = "restoring"
        return RestoreReport(
            snapshot=snapshot, next_offset=70, log_start_offset=0, pipeline=self.pipeline()
        )

    def override(self) -> PipelineInfo:
        raise Conflict("this engine does not disagree with the active: nothing to override")

    def buffer(self, last: int) -> list[BufferedRow]:
        rows = [BufferedRow(msg_id=i, kind="out", key="h", value="{}") for i in range(60, 70)]
        return rows[-last:]

    def metrics(self) -> str:
        return "twinstream_role 1\n"

    def timeline(self) -> TimelineInfo:
        return TimelineInfo.model_validate(fakes.timeline())


@pytest.fixture
def client():
    return TestClient(create_app(FakeEngine(), TOKEN), raise_server_exceptions=False)


PROTECTED = [
    ("GET", "/server"),
    ("GET", "/pipeline"),
    ("POST", "/pipeline/stop"),
    ("POST", "/pipeline/start"),
    ("POST", "/pipeline/persist"),
    ("POST", "/pipeline/restore"),
    ("GET", "/pipeline/buffer"),
    ("GET", "/metrics"),
    ("GET", "/timeline"),
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
    engine = FakeEngine()

    def fails() -> PipelineInfo:
        raise ZeroDivisionError("division by zero")

    engine.pipeline = fails  # type: ignore[method-assign]
    client = TestClient(create_app(engine, TOKEN), raise_server_exceptions=False)
    response = client.get("/pipeline", headers=AUTH)
    assert response.status_code == 500
    assert response.json() == {"reason": "ZeroDivisionError: division by zero"}


def _public(app: FastAPI) -> set[str]:
    """The paths of `app`'s routes that answer a request without a token other than 401."""
    client = TestClient(app, raise_server_exceptions=False)
    return {
        route.path
        for route in app.routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if client.request(method, route.path).status_code != 401
    }


def test_exactly_the_documented_pages_are_public():
    # What README's admin API paragraph and docs/design.md say: a route added without
    # the token, or a public page added or dropped, fails here until the docs follow.
    assert public_paths() == {"/healthz", "/openapi.json", "/docs"}
    app = create_app(FakeEngine(), TOKEN)
    assert _public(app) == public_paths()
    client = TestClient(app, raise_server_exceptions=False)
    assert all(client.get(path).status_code == 200 for path in public_paths())
    # Unknown paths and methods are refused without the token too: a stranger learns
    # nothing about what exists beyond the OpenAPI document.
    assert client.get("/no/such/page").status_code == 401
    assert client.delete("/server").status_code == 401
    assert client.get("/redoc").status_code == 401
    readme = (REPO_ROOT / "README.md").read_text()
    paragraph = readme[readme.index("\nAdmin API: ") :].split("\n\n")[0]
    assert all(f"`{path}`" in paragraph for path in public_paths()), paragraph


def test_without_the_docs_only_the_health_probe_is_public():
    app = create_app(FakeEngine(), TOKEN, docs=False)
    assert _public(app) == public_paths(docs=False) == {"/healthz"}
    client = TestClient(app, raise_server_exceptions=False)
    assert client.get("/openapi.json").status_code == 401
    assert client.get("/docs", headers=AUTH).status_code == 404


def test_errors_of_routing_are_json_with_a_reason_too(client):
    missing = client.get("/no/such/page", headers=AUTH)
    assert (missing.status_code, missing.json()) == (404, {"reason": "Not Found"})
    wrong_method = client.put("/server", headers=AUTH)
    assert (wrong_method.status_code, wrong_method.json()) == (
        405,
        {"reason": "Method Not Allowed"},
    )
    assert wrong_method.headers["allow"] == "GET"
    unreadable = client.post(
        "/pipeline/restore",
        headers={**AUTH, "Content-Type": "application/json"},
        content=b"\xbb",
    )
    assert unreadable.status_code in (400, 422)
    assert set(unreadable.json()) == {"reason"}


def test_a_request_without_the_token_is_refused_before_its_body_is_read(client):
    response = client.post("/pipeline/restore", content=b"{not json")
    assert response.status_code == 401
    assert response.json() == {"reason": "missing bearer token (Authorization: Bearer <token>)"}


def test_a_multi_line_error_answers_its_first_line_only():
    engine = FakeEngine()

    def fails() -> PipelineInfo:
        raise RuntimeError(
            "py4j failed\n\tat org.apache.spark.sql.Dataset.collect(Dataset.scala:1)"
        )

    engine.pipeline = fails  # type: ignore[method-assign]
    client = TestClient(create_app(engine, TOKEN), raise_server_exceptions=False)
    response = client.get("/pipeline", headers=AUTH)
    assert response.status_code == 500
    assert response.json() == {
        "reason": "RuntimeError: py4j failed (the engine's log has the rest)"
    }


def test_openapi_is_published_and_an_empty_token_is_refused(client):
    assert "/pipeline/stop" in client.get("/openapi.json").json()["paths"]
    with pytest.raises(ValueError, match="TWINSTREAM_ADMIN_TOKEN"):
        create_app(FakeEngine(), "")


def test_persist_is_refused_on_the_active_with_a_reason():
    engine = FakeEngine()
    client = TestClient(create_app(engine, TOKEN), raise_server_exceptions=False)
    assert client.post("/pipeline/persist", headers=AUTH).json()["next_offset"] == 70
    engine.role = "active"
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


def test_the_timeline_reaches_the_client_as_the_engine_gave_it():
    # Through the ASGI app (TestClient's transport), so that a field the engine's snapshot
    # has and the response model drops (or misnames) shows as a difference.
    with TestClient(create_app(FakeEngine(), TOKEN)) as http:
        engine = EngineClient("a", "http://testserver", TOKEN, transport=http._transport)
        assert engine.timeline().model_dump() == fakes.timeline()


# -- https ---------------------------------------------------------------------------------


def write_tls_files(folder: Path) -> TlsFiles:
    """A throwaway CA, and a server certificate it signed for 127.0.0.1 and localhost, as
    the stack makes them (twinstream.stack.tls)."""
    files, _ = ensure_tls(folder, ("127.0.0.1", "localhost"))
    return files


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return write_tls_files(tmp_path_factory.mktemp("tls"))


@contextmanager
def serving(app: FastAPI, settings: Settings, sock: socket.socket) -> Iterator[None]:
    """`app` on uvicorn in a thread, on `sock`, with TLS as spark_jobs/engine.py sets it
    up from the settings; stopped on the way out."""
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            ssl_certfile=settings.admin_tls_certfile or None,
            ssl_keyfile=settings.admin_tls_keyfile or None,
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive(), "uvicorn stopped before it served"
            assert time.monotonic() < deadline, "uvicorn did not start within 20 s"
            time.sleep(0.02)
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def https_engine(tls: TlsFiles) -> Iterator[Settings]:
    """An engine's admin API over https on a free 127.0.0.1 port: the settings that
    describe it (engine "a" at that port, the engine's key pair and the CA)."""
    # Bound here, handed to uvicorn: no other process can take the port in between.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        settings = load_settings(
            engine_ids=["a"],
            engine_admin_ports=[port],
            admin_tls_certfile=str(tls.cert),
            admin_tls_keyfile=str(tls.key),
            admin_tls_cafile=str(tls.ca),
        )
        with serving(create_app(FakeEngine(), TOKEN), settings, sock):
            yield settings


def test_an_https_engine_is_reached_with_its_ca(https_engine: Settings, tls: TlsFiles):
    url = https_engine.engine_admin_url("a")
    assert url.startswith("https://127.0.0.1:")
    with EngineClient.from_settings(https_engine, "a", TOKEN, timeout_s=5) as client:
        assert client.server().role == "standby"
        assert client.healthy()
    port = https_engine.engine_admin_port("a")
    # As the DAGs build it: an Airflow connection with schema https and the CA in its extra,
    # which Airflow hands over as a dict (extra_dejson) or as JSON text (extra).
    for extra in ({"ca": str(tls.ca)}, f'{{"ca": "{tls.ca}"}}'):
        with EngineClient.from_connection("a", "127.0.0.1", port, "https", TOKEN, extra) as c:
            assert c.pipeline().state == "running"


def test_an_https_engine_refuses_a_client_without_its_ca(https_engine: Settings):
    url = https_engine.engine_admin_url("a")
    # The system's trusted CAs: the throwaway CA is not one of them.
    with EngineClient("a", url, TOKEN, timeout_s=5) as client:
        with pytest.raises(EngineError) as refused:
            client.server()
        assert not client.healthy()
    assert refused.value.status is None
    message = str(refused.value)
    assert "the engine's TLS certificate does not verify" in message
    assert "TWINSTREAM_ADMIN_TLS_CAFILE" in message
    assert "CERTIFICATE_VERIFY_FAILED" in message
    # Plain HTTP to an https engine fails too: it expects a TLS handshake.
    plain = url.replace("https://", "http://")
    with EngineClient("a", plain, TOKEN, timeout_s=5) as client, pytest.raises(EngineError):
        client.server()


def test_a_ca_file_that_does_not_load_is_named(tmp_path: Path, tls: TlsFiles):
    with pytest.raises(EngineError, match=r"CA file .*nope\.pem does not load"):
        EngineClient("a", "https://127.0.0.1:1", TOKEN, cafile=str(tmp_path / "nope.pem"))
    with pytest.raises(EngineError, match="give the path of the PEM certificate of the CA"):
        EngineClient("a", "https://127.0.0.1:1", TOKEN, cafile=str(tls.key))
    with pytest.raises(ValueError, match=r'extra "ca" is 3'):
        EngineClient.from_connection("a", "h", 1, "https", TOKEN, {"ca": 3})
    with pytest.raises(ValueError, match="extra is not JSON"):
        EngineClient.from_connection("a", "h", 1, "https", TOKEN, "ca=/x")


def test_pipeline_info_gives_positions_per_partition_or_the_scalar_of_one():
    """One rule for the drill, the chaos kit and the overview: per-partition positions when
    the engine gives them, else partition 0's scalar, else none."""
    one = fakes.pipeline_info(
        last_msg_id_processed=9, last_msg_id_published=None, processed={}, published={}
    )
    assert one.processed_positions() == {0: 9}
    assert one.published_positions() == {}
    many = fakes.pipeline_info(processed={0: 9, 1: 4}, published={1: 3})
    assert many.processed_positions() == {0: 9, 1: 4}
    assert many.published_positions() == {1: 3}


def test_pipeline_info_says_how_far_the_query_has_read_per_partition():
    """An engine restarted at the topic's end processes nothing: `read_up_to` still says
    it has read everything (the harness's catch-up wait reads it)."""
    info = fakes.pipeline_info(processed={}, read_up_to={0: 100, 1: 50})
    assert info.model_dump()["read_up_to"] == {0: 100, 1: 50}
    assert fakes.pipeline_info().read_up_to == {}
