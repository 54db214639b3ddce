"""The Airflow plugin (plugins/twinstream_operator.py) loads through Airflow's own plugin
manager without import errors, as the API server and the UI take it, and does no network
work when it is imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

from twinstream.platform.settings import REPO_ROOT

LOAD = textwrap.dedent(
    """
    import json, socket, sys
    attempts = []
    real_connect = socket.socket.connect

    def connect(self, address):
        attempts.append(str(address))
        raise OSError("no network at plugin import")

    socket.socket.connect = connect
    from airflow import plugins_manager
    from airflow.api_fastapi.core_api.datamodels.plugins import PluginResponse

    plugins_manager.ensure_plugins_loaded()
    infos = {p["name"]: p for p in plugins_manager.get_plugin_info()}
    problems = []
    for info in infos.values():
        try:
            PluginResponse.model_validate(info)  # what GET /api/v2/plugins answers
        except Exception as exc:
            problems.append(str(exc))
    apps = [a["url_prefix"] for a in plugins_manager.get_fastapi_plugins()[0]]
    print("RESULT " + json.dumps({
        "errors": {k: str(v) for k, v in plugins_manager.get_import_errors().items()},
        "plugins": sorted(infos),
        "views": [v for p in infos.values() for v in p.get("external_views", [])],
        "apps": apps,
        "invalid": problems,
        "connects": attempts,
        "heavy": sorted(m for m in ("pyspark", "kazoo", "great_expectations") if m in sys.modules),
    }))
    """
)


def load_plugins() -> dict[str, Any]:
    env = {
        **__import__("os").environ,
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
        "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "False",
    }
    out = subprocess.run(
        [sys.executable, "-c", LOAD], capture_output=True, text=True, env=env, timeout=180
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"the plugin manager did not finish: {out.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(lines[0].removeprefix("RESULT "))
    return result


def test_the_plugin_loads_without_errors_and_without_network_work():
    result = load_plugins()
    assert result["errors"] == {}
    assert "twinstream" in result["plugins"]
    assert result["invalid"] == []
    assert "/twinstream" in result["apps"]
    (view,) = [v for v in result["views"] if v["name"] == "Twinstream"]
    assert (view["href"], view["url_route"], view["destination"]) == (
        "/twinstream/",
        "twinstream",
        "nav",
    )
    assert result["connects"] == []
    # Nothing heavy for an API server that only shows a page.
    assert result["heavy"] == []
