"""The operator page follows the pipelines file while the API server runs: a pipeline `up`
adds (no Airflow restart any more) appears at the page's next poll, a removed one goes, and
a file caught half-edited keeps the last good list instead of breaking the page."""

from __future__ import annotations

import os
from pathlib import Path

from fastapi.testclient import TestClient

from tests.unit.ops.test_operator_ui import logged_in
from tests.unit.ops.test_overview import ACTIVE, fake_engines, standby
from twinstream.ops.operator_ui.app import Sources, create_app
from twinstream.platform.settings import load_settings

ONE = '[hostmetrics]\nmodule = "m.h"\n'
TWO = ONE + '\n[shop]\nmodule = "m.s"\nengines = ["e", "f"]\nadmin_ports = [8705, 8706]\n'


def _write(path: Path, text: str, mtime_ns: int) -> None:
    """Write and set the modification time: two writes within the file system's clock
    granularity must still count as a change (size alone may not differ)."""
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def _names(client: TestClient) -> list[str]:
    body = client.get("/api/overview").json()
    return [p["name"] for p in body["overview"]["pipelines"]]


def test_a_pipeline_added_to_or_removed_from_the_file_shows_without_a_restart(tmp_path: Path):
    path = tmp_path / "pipelines.toml"
    _write(path, ONE, 1_000_000_000)
    settings = load_settings(admin_token="t", state_dir=tmp_path, pipelines_file=path)
    answers = {"a": ACTIVE, "b": standby({0: 100}, 5), "e": ACTIVE, "f": standby({0: 1}, 0)}
    sources = Sources(settings=lambda: settings, engines=fake_engines(answers))
    client = TestClient(create_app(sources, auth=logged_in))
    client.cookies.set("_token", "good")

    assert _names(client) == ["hostmetrics"]
    first = sources.pipelines()
    assert sources.pipelines() is first  # unchanged file: not parsed again
    _write(path, TWO, 2_000_000_000)
    assert _names(client) == ["hostmetrics", "shop"]
    assert sources.pipelines()["shop"].engine_ids == ["e", "f"]
    _write(path, ONE, 3_000_000_000)
    assert _names(client) == ["hostmetrics"]
    assert client.get("/datadocs/shop/index.html").status_code == 404


def test_a_file_that_no_longer_reads_keeps_the_last_good_pipelines(tmp_path: Path, caplog):
    path = tmp_path / "pipelines.toml"
    _write(path, TWO, 1_000_000_000)
    settings = load_settings(admin_token="t", state_dir=tmp_path, pipelines_file=path)
    sources = Sources(settings=lambda: settings)
    assert list(sources.pipelines()) == ["hostmetrics", "shop"]
    _write(path, TWO + "[broken\n", 2_000_000_000)
    assert list(sources.pipelines()) == ["hostmetrics", "shop"]
    assert "does not read" in caplog.text
    # Fixed again: read again.
    _write(path, ONE, 3_000_000_000)
    assert list(sources.pipelines()) == ["hostmetrics"]
