"""The plugin's app (twinstream.ops.operator_ui) with fake engines and a fake login: the page,
the overview, Data Docs rewritten to load nothing from the internet, the vendored files
checked against their manifest, and nothing served without Airflow's login."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import HTTPException, Request
from fastapi.testclient import TestClient

from tests.unit import fakes
from tests.unit.ops.test_overview import ACTIVE, fake_engines, standby
from twinstream.engine.client import EngineClient
from twinstream.ops.operator_ui import vendor
from twinstream.ops.operator_ui.app import PREFIX, STATIC, Sources, create_app
from twinstream.ops.operator_ui.datadocs import CDN, VENDOR, external_resources, offline
from twinstream.platform.settings import CommonSettings, Settings, load_settings

GE_VIEW = Path(str(__import__("great_expectations").__file__)).parent / "render" / "view"


def logged_in(request: Request) -> None:
    """Stands for Airflow's requires_authenticated(): the UI's cookie, or 401."""
    if request.cookies.get("_token") != "good":
        raise HTTPException(401, "Not authenticated")


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    settings = load_settings(admin_token="t", state_dir=tmp_path)
    answers = {"a": ACTIVE, "b": standby({0: 100}, 5), "c": ACTIVE, "d": 401}
    sources = Sources(settings=lambda: settings, engines=fake_engines(answers))
    test_client = TestClient(create_app(sources, auth=logged_in))
    test_client.cookies.set("_token", "good")
    return test_client


def data_docs_page(tmp_path: Path) -> Path:
    site = tmp_path / "audit" / "hostmetrics" / "gx" / "uncommitted" / "data_docs" / "local_site"
    page = site / "validations" / "run.html"
    page.parent.mkdir(parents=True)
    links = "".join(
        f'<script src="{url}" integrity="sha384-x" crossorigin="anonymous">' for url in CDN
    )
    logo = "https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/logo-long.png?d=1&dataContextId=x"
    page.write_text(f'<html><head>{links}</head><body><img src="{logo}"></body></html>')
    (site / "static" / "images").mkdir(parents=True)
    (site / "static" / "images" / "logo-long.png").write_bytes(b"png")
    return page


def test_the_page_and_the_overview_need_the_airflow_login(client: TestClient):
    page = client.get("/")
    assert page.status_code == 200
    assert f'src="{PREFIX}/static/page.js"' in page.text
    body = client.get("/api/overview").json()
    host, pay = body["overview"]["pipelines"]
    assert host["active"] == "a"
    assert [e["role"] for e in host["engines"]] == ["active", "standby"]
    assert pay["engines"][1]["unauthorized"] is True
    assert set(body["actions"]) == {
        "persist_standby_state",
        "restore_and_resync",
        "failover_drill",
        "deploy_pipeline",
    }
    client.cookies.clear()
    for path in (
        "/",
        "/api/overview",
        "/api/timeline/hostmetrics",
        "/static/page.js",
        "/vendor/MANIFEST.json",
    ):
        assert client.get(path).status_code == 401, path


def test_data_docs_are_served_with_every_resource_from_this_server(
    client: TestClient, tmp_path: Path
):
    data_docs_page(tmp_path)
    html = client.get("/datadocs/hostmetrics/validations/run.html").text
    assert external_resources(html) == []
    assert f'src="{PREFIX}/vendor/jquery@3.7.1/dist/jquery.min.js"' in html
    assert f'src="{PREFIX}/datadocs/hostmetrics/static/images/logo-long.png"' in html
    assert "integrity=" not in html
    # Every rewritten URL is a file the plugin serves.
    for local in CDN.values():
        assert client.get(f"/vendor/{local}").status_code == 200, local
    assert client.get("/datadocs/hostmetrics/static/images/logo-long.png").content == b"png"


@pytest.mark.parametrize(
    "path",
    [
        "/datadocs/hostmetrics/../../../etc/passwd",
        "/datadocs/hostmetrics/%2e%2e/%2e%2e/admin-token",
        "/datadocs/nosuch/index.html",
        "/vendor/../app.py",
        "/static/..%2fapp.py",
    ],
)
def test_nothing_outside_the_served_folders_is_reachable(
    client: TestClient, tmp_path: Path, path: str
):
    data_docs_page(tmp_path)
    (tmp_path / "admin-token").write_text("secret")
    response = client.get(path)
    assert response.status_code == 404
    assert "secret" not in response.text


def test_a_pipeline_never_audited_says_how_to_get_data_docs(client: TestClient):
    response = client.get("/datadocs/hostmetrics/index.html")
    assert response.status_code == 404
    assert "audit_output_topic" in response.json()["detail"]


def test_ge_templates_load_nothing_the_rewrite_does_not_know():
    """A GE upgrade that adds or changes a CDN URL fails here, not silently in a browser."""
    # The templates, and the styles GE inlines into every page.
    sources = [*(GE_VIEW / "templates").rglob("*.j2"), *(GE_VIEW / "static").rglob("*.css")]
    text = "\n".join(p.read_text() for p in sources)
    assert external_resources(text), "GE's pages load nothing from CDNs any more?"
    rewritten = offline(text, "/v", "/s")
    loads = [r for r in external_resources(rewritten) if "{{" not in r]
    assert loads == []


def test_vendored_files_match_their_manifest():
    manifest = json.loads((VENDOR / "MANIFEST.json").read_text())
    assert set(CDN.values()) <= set(manifest)
    for path, entry in manifest.items():
        digest = hashlib.sha256((VENDOR / path).read_bytes()).hexdigest()
        assert digest == entry["sha256"], path


NOW = 1_000_000.0


def timeline_engines(timelines: dict[str, dict[str, Any] | int | None]):
    """engine id -> its GET /timeline body, an HTTP status it refuses with, or None for an
    engine that does not answer."""

    def make(settings: Settings, engine_id: str) -> EngineClient:
        answer = timelines[engine_id]

        def handle(request: httpx.Request) -> httpx.Response:
            assert request.url.path == "/timeline", request.url.path
            if answer is None:
                raise httpx.ConnectError("connection refused", request=request)
            if isinstance(answer, int):
                return httpx.Response(answer, json={"reason": "not found"})
            return httpx.Response(200, json=answer)

        return EngineClient(engine_id, "http://engine", "t", transport=httpx.MockTransport(handle))

    return make


def test_the_timeline_is_one_json_per_pipeline_merged_from_its_engines(tmp_path: Path):
    settings = load_settings(admin_token="t", state_dir=tmp_path)
    point = {"p50_s": None, "p99_s": None, "published": 0, "in_per_s": 50.0, "lag": 7}
    a = fakes.timeline(NOW)  # the active: published at NOW - 10, took over at NOW - 8
    b = fakes.timeline(NOW, points=[{**point, "t": NOW - 10}], takeovers=[])
    sources = Sources(
        settings=lambda: settings,
        engines=timeline_engines({"a": a, "b": b, "c": 404, "d": None}),
        clock=lambda: NOW + 1,
    )
    test_client = TestClient(create_app(sources, auth=logged_in))
    test_client.cookies.set("_token", "good")
    host = test_client.get("/api/timeline/hostmetrics").json()
    assert host["now"] == NOW + 1
    assert host["t"] == [NOW - 10, NOW - 5]
    assert (host["p50_s"], host["p99_s"], host["published"]) == ([0.4, None], [0.9, None], [500, 0])
    assert host["in_per_s"] == [75.0, 100.0]
    assert host["lag"] == {"a": [20, None], "b": [7, None]}
    assert host["takeovers"] == [{"t": NOW - 8, "epoch": 3, "engine_id": "a"}]
    assert host["unread"] == {}
    # An engine of an older version (404) or one that is down: no figures, and why.
    pay = test_client.get("/api/timeline/payments").json()
    assert pay["t"] == []
    assert set(pay["unread"]) == {"c", "d"}
    assert pay["unread"]["c"] == "HTTP 404"
    assert test_client.get("/api/timeline/nosuch").status_code == 404


def test_the_page_loads_only_vendored_files_the_manifest_pins():
    html = (STATIC / "index.html").read_text()
    loaded = re.findall(r'(?:src|href)="\{\{PREFIX\}\}/vendor/([^"]+)"', html)
    assert sorted(loaded) == sorted(vendor.PAGE)
    manifest = json.loads((VENDOR / "MANIFEST.json").read_text())
    assert set(vendor.PAGE) <= set(manifest)
    assert external_resources(html) == []


def test_the_page_shows_each_publisher_adapter_as_its_status_node_says(tmp_path: Path):
    """The overview the page draws has each pipeline's adapters (read by the reader
    `twinstream status` uses); the page's table shows fields the view has, in the columns
    the operator needs."""
    from twinstream.ops.overview import AdapterView

    settings = load_settings(admin_token="t", state_dir=tmp_path)
    answers = {"a": ACTIVE, "b": standby({0: 100}, 5), "c": ACTIVE, "d": 401}
    asked: list[str] = []

    def adapters(pipeline: CommonSettings) -> list[AdapterView]:
        asked.append(pipeline.pipeline)
        if pipeline.pipeline != "hostmetrics":
            return []
        return [
            AdapterView(
                adapter_id="in-1",
                role="active",
                epoch=2,
                position="stdin@0.L40:4000",
                published=40,
                source_lag=1200,
            ),
            AdapterView(adapter_id="in-2", role="standby", last_error="Fenced: took over"),
        ]

    sources = Sources(settings=lambda: settings, engines=fake_engines(answers), adapters=adapters)
    test_client = TestClient(create_app(sources, auth=logged_in))
    test_client.cookies.set("_token", "good")
    host, pay = test_client.get("/api/overview").json()["overview"]["pipelines"]
    assert asked == ["hostmetrics", "payments"]
    assert [(a["adapter_id"], a["role"], a["source_lag"]) for a in host["adapters"]] == [
        ("in-1", "active", 1200),
        ("in-2", "standby", None),
    ]
    assert host["adapters"][0]["position"] == "stdin@0.L40:4000"
    assert host["adapters"][1]["last_error"] == "Fenced: took over"
    assert pay["adapters"] == []
    script = (STATIC / "page.js").read_text()
    row = script[script.index("function adapterRow") : script.index("function adaptersTable")]
    shown = set(re.findall(r"\ba\.([a-z0-9_]+)", row))
    assert shown <= set(AdapterView.model_fields), shown - set(AdapterView.model_fields)
    assert {"adapter_id", "role", "position", "source_lag", "published", "last_error"} <= shown
    for column in ("source position", "lag to source end", "published", "last error"):
        assert f'"{column}"' in script
    assert "adaptersTable(p)" in script[script.index("function pipelineSection") :]


def test_the_page_shows_each_engines_agreement_and_a_disagreement_in_full(tmp_path: Path):
    """The overview the page draws has each engine's agreement, a disagreement's msg_id, the
    active's transaction and both sides' rows; the page's script shows them (reading only
    fields the models have), in red, and restores such an engine from a proven snapshot."""
    from twinstream.engine.api import AgreementInfo, BufferedRow, Difference

    settings = load_settings(admin_token="t", state_dir=tmp_path)
    answers = {
        "a": ACTIVE,
        "b": standby({0: 100}, 5, in_sync=True, agreement=fakes.disagreement()),
        "c": ACTIVE,
        "d": standby({0: 100}, 5, in_sync=True, agreement={"state": "agrees"}),
    }
    sources = Sources(settings=lambda: settings, engines=fake_engines(answers))
    test_client = TestClient(create_app(sources, auth=logged_in))
    test_client.cookies.set("_token", "good")
    body = test_client.get("/api/overview").json()
    host, pay = body["overview"]["pipelines"]
    assert not body["ok"]
    b = host["engines"][1]
    assert b["agreement"]["state"] == "disagrees"
    difference = b["agreement"]["difference"]
    assert (difference["msg_id"], difference["first"], difference["last"]) == (1000, 950, 1040)
    assert [r["value"] for r in difference["active_rows"]] == ['{"avg": 0.5}']
    assert [r["value"] for r in difference["engine_rows"]] == ['{"avg": 0.7}']
    assert any("engine b disagrees" in p for p in host["problems"])
    assert pay["engines"][1]["agreement"]["state"] == "agrees"

    script = (STATIC / "page.js").read_text()
    drawn = script[script.index("function msgId") : script.index("function engineRow")]
    assert set(re.findall(r"\ba\.([a-z_]+)", drawn)) <= set(AgreementInfo.model_fields)
    assert set(re.findall(r"\bd\.([a-z_]+)", drawn)) <= set(Difference.model_fields)
    assert set(re.findall(r"\br\.([a-z_]+)", drawn)) <= set(BufferedRow.model_fields)
    for shown in ("msg_id", "first", "last", "epoch", "active_rows", "engine_rows"):
        assert f"d.{shown}" in drawn, shown
    assert 'class: "fail" }, `DISAGREES${where}`' in drawn
    assert '"agreement"' in script[script.index("const ENGINE_COLUMNS") :]
    row = script[script.index("function engineRow") : script.index("function bytes")]
    assert "agreementCell(e)" in row
    assert 'snapshot: "proven"' in row
    section = script[script.index("function pipelineSection") :]
    assert "disagreementRow(e, ENGINE_COLUMNS.length)" in section


def test_a_pipeline_with_an_engine_on_other_code_than_its_files_offers_its_deploy():
    """Issue 51: the page's Deploy button triggers deploy_pipeline for that pipeline, shown
    only while an engine runs other code than its files (EngineView.stale)."""
    from twinstream.ops.overview import EngineView

    assert "stale" in EngineView.model_fields
    script = (STATIC / "page.js").read_text()
    section = script[script.index("function pipelineSection") :]
    offered = section[: section.index("deploy-now-${p.name}")]
    assert "p.engines.some((e) => e.stale)" in offered
    assert '"deploy_pipeline", { pipeline: p.name }' in offered


def test_the_page_shows_the_machines_warm_spares_and_the_engines_they_became(
    tmp_path: Path, client: TestClient
):
    """The keeper's status (twinstream.engine.spare_keeper) in the overview the page reads;
    the script reads only fields SpareView has."""
    import os

    from twinstream.engine.spare_keeper import write_status
    from twinstream.ops.overview import SpareView

    settings = load_settings(admin_token="t", state_dir=tmp_path)  # the client fixture's
    test_client = client
    assert test_client.get("/api/overview").json()["overview"]["spares"] is None  # no keeper
    # As a live keeper (this process) writes it.
    write_status(
        settings.spares_dir,
        [
            {"name": f"{os.getpid()}-2", "pid": 12, "status": "warm"},
            {"name": f"{os.getpid()}-1", "pid": 11, "status": "adopted", "engine_id": "b", "at": 0},
        ],
    )
    spares = test_client.get("/api/overview").json()["overview"]["spares"]
    assert [(s["status"], s["engine_id"]) for s in spares] == [("warm", None), ("adopted", "b")]
    assert spares[1]["adopted_at"] == "1970-01-01T00:00:00+00:00"
    script = (STATIC / "page.js").read_text()
    drawn = script[script.index("function sparesLine") :]
    drawn = drawn[: drawn.index("\n}\n")]
    assert set(re.findall(r"\bs\.([a-z_]+)", drawn)) <= set(SpareView.model_fields)
