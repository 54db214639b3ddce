"""The Twinstream page with a disagreement on it (docs/img/agreement_disagreement.png), taken
with headless Chromium from a stack that runs pipelines/skewed.py (its engines differ on
every 1,000th msg_id, as a transform reading the wall clock would).

    mkdir -p /tmp/demo && cat pipelines.toml > /tmp/demo/pipelines.toml
    ln -sfn "$PWD/pipelines" /tmp/demo/pipelines   # the pipelines file's folder is on the path
    printf '\\n[skewed]\\nmodule = "pipelines.skewed"\\n' >> /tmp/demo/pipelines.toml
    printf 'engines = ["e", "f"]\\nadmin_ports = [8705, 8706]\\n' >> /tmp/demo/pipelines.toml
    export TWINSTREAM_PIPELINES_FILE=/tmp/demo/pipelines.toml TWINSTREAM_STACK_PIPELINES=skewed
    make up
    PYTHONPATH=. .venv/bin/python docs/disagreement_screenshot.py
    make down

Publishes 2,500 of the pipeline's sample records, waits (with a progress line) until its
standby reports the disagreement, then captures the page.
"""

from __future__ import annotations

import time

from devkit.browser import chromium, open_twinstream_page
from twinstream.edge.feed import publish
from twinstream.engine.client import EngineClient
from twinstream.platform import registry
from twinstream.platform.settings import REPO_ROOT, load_settings

SHOT = REPO_ROOT / "docs" / "img" / "agreement_disagreement.png"


def main() -> int:
    base = load_settings()
    settings = registry.settings_for(base, "skewed")
    token = settings.secret("admin_token")
    from pipelines.skewed import pipeline

    assert pipeline.sample is not None
    publish(settings, pipeline.sample(2_500, 1, 0), rate=500)
    clients = [EngineClient.from_settings(settings, e, token) for e in settings.engine_ids]
    deadline = time.monotonic() + 300
    while not any(c.pipeline().agreement.state == "disagrees" for c in clients):
        states = {c.engine_id: c.pipeline().agreement.state for c in clients}
        if time.monotonic() > deadline:
            raise SystemExit(f"no engine disagrees after 5 minutes: {states}")
        print(f"waiting for the standby to compare: {states}", flush=True)
        time.sleep(3)  # a progress line every 3 s, under the deadline above
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        frame = open_twinstream_page(page, settings)
        frame.locator("tr.disagreement").first.wait_for(timeout=60_000)
        page.screenshot(path=str(SHOT), full_page=True)
    print(f"wrote {SHOT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
