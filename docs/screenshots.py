"""Screenshots of the Airflow UI for the README, taken with headless Chromium.

    make up            # the local stack must be running
    make screenshots   # installs Debian's chromium (make browser), then runs this

Publishes a little data so that the standby is in sync, runs `persist_standby_state` and
`audit_output_topic` through Airflow's REST API, and captures the persist run, the
`restore_and_resync` trigger form and the audit's Great Expectations Data Docs (through the
Twinstream plugin, styled without the internet) into
docs/img/.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx

from devkit.browser import CHROMIUM, CHROMIUM_ARGS
from pipelines.hostmetrics.generate import synthetic
from twinstream.edge.feed import publish
from twinstream.ops.audit import data_docs_site
from twinstream.platform.settings import REPO_ROOT, load_settings
from twinstream.stack.layout import Layout


def api_token(base: str, airflow_home: Path) -> str:
    passwords = json.loads(
        (airflow_home / "simple_auth_manager_passwords.json.generated").read_text()
    )
    response = httpx.post(
        f"{base}/auth/token",
        json={"username": "admin", "password": passwords["admin"]},
        timeout=30,
    )
    response.raise_for_status()
    return str(response.json()["access_token"])


def run_dag(api: httpx.Client, dag_id: str, conf: dict[str, object], timeout_s: float) -> str:
    api.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": False}).raise_for_status()
    response = api.post(f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})
    response.raise_for_status()
    run_id = str(response.json()["dag_run_id"])
    deadline = time.monotonic() + timeout_s
    while True:
        state = api.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}").json()["state"]
        print(f"  {dag_id} {run_id}: {state}", flush=True)
        if state in ("success", "failed"):
            return run_id
        if time.monotonic() > deadline:
            raise SystemExit(f"{dag_id} did not finish within {timeout_s:.0f} s")
        time.sleep(5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "img")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    settings = load_settings()
    base = settings.airflow_url
    token = api_token(base, Layout.of(settings).airflow_home)
    api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    # More than the audit's in-flight allowance, so that the audit has a range to prove.
    count = settings.audit_inflight_msgs + 5000
    print(f"publishing {count:,} events for the standby to persist and the audit", flush=True)
    publish(settings, synthetic(count, max_record_bytes=settings.max_record_bytes), rate=0)
    persist_run = run_dag(api, "persist_standby_state", {}, timeout_s=600)
    run_dag(api, "audit_output_topic", {}, timeout_s=600)
    data_docs = data_docs_site(settings.audit_dir)

    args.output.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.add_cookies([{"name": "_token", "value": token, "url": base}])
        page = context.new_page()

        page.goto(f"{base}/dags/persist_standby_state/runs/{persist_run}")
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(2000)
        page.screenshot(path=str(args.output / "persist_run.png"))

        page.goto(f"{base}/dags/restore_and_resync")
        page.wait_for_load_state("networkidle")
        page.get_by_role("button", name="Trigger").first.click()
        page.wait_for_timeout(1500)
        page.screenshot(path=str(args.output / "restore_params_form.png"))

        # The newest validation result page of the msg_id suite.
        pages = sorted(
            (data_docs / "validations" / "twinstream_msg_ids").rglob("*.html"),
            key=lambda p: p.stat().st_mtime,
        )
        # Through the Twinstream plugin, as an operator opens them: styled, offline.
        newest = (pages[-1] if pages else data_docs / "index.html").relative_to(data_docs)
        page.goto(f"{base}/twinstream/datadocs/{settings.pipeline}/{newest.as_posix()}")
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(1000)
        page.screenshot(path=str(args.output / "audit_data_docs.png"), full_page=False)
        browser.close()
    for name in ("persist_run.png", "restore_params_form.png", "audit_data_docs.png"):
        print(f"wrote {args.output / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
