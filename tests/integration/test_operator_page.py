"""The operator's page in the Airflow UI, for real: headless Chromium logs in to the stack's
Airflow, opens Twinstream from the navigation, sees the active engine and its latency chart
move under a light load and follows a kill -9 of it (the new active named, a takeover mark on
the chart); and, its own test on the same page, triggers a restore of an engine from the
page as a DAG run (its DAG paused: the page says the run waits until it is unpaused, and
how). Both tests share one logged-in browser page (`twinstream_page`) under one light load.

Runs on the stack's own hostmetrics pair while `up` has left it running (right after
test_stack.py): the chaos tests that follow wait for the killed engine to be back in sync.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
import pytest

from devkit.browser import admin_password, chromium, open_twinstream_page
from devkit.chaos import SteadyLoad, SupervisedEngines
from devkit.harness import wait_for
from devkit.pace import bound
from twinstream.platform.settings import REPO_ROOT, Settings
from twinstream.stack.layout import Layout

if TYPE_CHECKING:
    from playwright.sync_api import FrameLocator, Locator, Page

pytestmark = pytest.mark.integration

SCREENSHOT = REPO_ROOT / "docs" / "img" / "operator_page.png"
# Light, so that the page's chart has a latency point in every 5 s bucket without making
# the standby's catch-up after the kill (the chaos tests that follow wait for it) longer.
RATE = 50.0


def chart(box: Locator) -> dict[str, float]:
    """What the pipeline's chart shows, from the data-* attributes the page keeps on it:
    latency points, the newest one's bucket, takeover marks and the newest mark's epoch."""
    return {
        "points": float(box.get_attribute("data-points") or 0),
        "last_t": float(box.get_attribute("data-last-t") or 0),
        "takeovers": float(box.get_attribute("data-takeovers") or 0),
        "last_epoch": float(box.get_attribute("data-last-epoch") or -1),
    }


def chart_when(
    box: Locator, condition: Callable[[dict[str, float]], bool]
) -> dict[str, float] | None:
    """The chart's state once `condition` holds of it (for wait_for), else None."""
    seen = chart(box)
    return seen if condition(seen) else None


@pytest.fixture(scope="module")
def api(stack, settings: Settings) -> Iterator[httpx.Client]:
    """Airflow's REST API as its admin."""
    token = httpx.post(
        f"{settings.airflow_url}/auth/token",
        json={"username": "admin", "password": admin_password(Layout.of(settings).airflow_home)},
        timeout=30,
    ).json()["access_token"]
    with httpx.Client(
        base_url=settings.airflow_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        yield client


@dataclass
class OperatorPage:
    """The Twinstream page, logged in as Airflow's admin, over the stack's hostmetrics pair
    under a light load."""

    page: Page
    frame: FrameLocator
    engines: SupervisedEngines


@pytest.fixture(scope="module")
def twinstream_page(
    stack, stack_engines: str, settings: Settings, api: httpx.Client
) -> Iterator[OperatorPage]:
    engines = SupervisedEngines(settings)
    wait_for(
        lambda: api.get("/api/v2/dags/restore_and_resync").status_code == 200,
        120,
        "the dag-processor to load restore_and_resync",
        every_s=1,
    )
    # The DAG stays paused: a run the page's button makes is checked, never executed here.
    api.patch("/api/v2/dags/restore_and_resync", json={"is_paused": True}).raise_for_status()
    # Once its standby is in sync: the page's first test names the active as it is then.
    engines.wait_pair(timeout_s=300)
    load = SteadyLoad(settings, RATE).start()
    try:
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1500, "height": 950})
            yield OperatorPage(page, open_twinstream_page(page, settings), engines)
    finally:
        load.stop()
        engines.close()


def test_the_page_names_the_active_and_follows_its_kill_9_within_5s(
    twinstream_page: OperatorPage, settings: Settings
) -> None:
    """The page names the active engine, its adapters and a moving latency chart; after a
    kill -9 of the active it names the new one within 5 s (times the pace) and marks the
    takeover on the chart, saying whether the new active's process was a warm spare."""
    frame, engines, page = twinstream_page.frame, twinstream_page.engines, twinstream_page.page
    badge = frame.locator(f"#active-{settings.pipeline}")
    badge.wait_for(timeout=30_000)
    shown: list[str] = []

    def names_active() -> str | None:
        """The active the page names, once it is the one the engines say is active now
        with an in-sync standby: on two busy cores a ZooKeeper session may expire and the
        lead move between the pair's check and the page's first answer."""
        current = engines.current_pair()
        shown[:] = [badge.inner_text()]
        now = current[0] if current else None
        return now if now is not None and shown[0] == f"active: {now}" else None

    try:
        active: str = wait_for(names_active, 60, "the page to name the active engine")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: it showed {shown}") from None
    # Payments' two publisher adapters (the test stack runs them, tests/conftest.py): a row
    # each, one active, as their status nodes say.
    rows = frame.locator("tr[data-adapter]")
    wait_for(lambda: rows.count() == 2, 30, "the page's publisher adapters table")
    roles = sorted(rows.nth(i).get_attribute("data-role") or "" for i in range(2))
    assert roles == ["active", "standby"], roles
    # The latency chart has points, and moves: a newer bucket's between two polls.
    box = frame.locator(f'[data-timeline="{settings.pipeline}"]')
    first = wait_for(
        lambda: chart_when(box, lambda c: c["points"] > 0),
        30,
        "latency points on the page's chart",
        every_s=0.2,
    )
    moved = wait_for(
        lambda: chart_when(box, lambda c: c["last_t"] > first["last_t"]),
        20,
        "the latency chart to move",
        every_s=0.2,
    )
    print(f"the chart moved: {first} -> {moved}")

    os.kill(engines.pid(active), signal.SIGKILL)
    killed = time.monotonic()
    wait_for(
        lambda: (
            badge.inner_text() not in (f"active: {active}", "no single active")
            and badge.inner_text().startswith("active: ")
        ),
        15,
        "the page to name the new active",
        every_s=0.05,
    )
    shown_s = time.monotonic() - killed
    new_active = badge.inner_text().removeprefix("active: ")
    print(f"the page named {new_active} active {shown_s:.2f} s after the kill -9")
    assert new_active != active
    assert shown_s <= bound(5.0), (
        f"the page took {shown_s:.2f} s to show the new active (bound {bound(5.0):.1f} s)"
    )
    # The takeover is a mark on the chart: the new active's, of a newer epoch (the killed
    # engine's own marks went with it).
    marked = wait_for(
        lambda: chart_when(box, lambda c: c["last_epoch"] > moved["last_epoch"]),
        15,
        "a takeover mark on the chart",
        every_s=0.2,
    )
    print(f"the takeover mark showed {time.monotonic() - killed:.2f} s after the kill")
    assert marked["takeovers"] >= 1
    # The takeovers table's row of it says whether the new active's process had been a warm
    # spare, as the engine itself does.
    row = frame.locator(f'tr[data-takeover="{int(marked["last_epoch"])}"]')
    row.wait_for(timeout=15_000)
    from_spare = engines.clients[new_active].server().from_spare
    assert row.get_attribute("data-from-spare") == ("yes" if from_spare else "no")
    assert ("a warm spare" if from_spare else "started cold") in row.inner_text()
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT))


def test_the_pages_restore_button_starts_a_dag_run_and_says_its_dag_is_paused(
    twinstream_page: OperatorPage, settings: Settings, api: httpx.Client
) -> None:
    """A click on an engine's Restore and its confirmation trigger one restore_and_resync
    run for that engine as the logged-in user; the DAG is paused, and the page says the run
    waits until it is unpaused, and how."""
    # The page as a person opens it now, whatever an earlier test left on it.
    twinstream_page.page.reload()
    frame = twinstream_page.page.frame_locator("iframe")
    buttons = frame.locator('button[data-action^="restore-"]')

    def restorable() -> str | None:
        """The engine of the first Restore button the page shows, once it shows one."""
        if buttons.count() == 0:
            return None
        action = buttons.first.get_attribute("data-action") or ""
        return action.removeprefix("restore-") or None

    try:
        engine: str = wait_for(restorable, 90, "a Restore button on the page")
    except AssertionError as exc:
        shown = frame.locator("body").inner_text()[:3000]
        raise AssertionError(f"{exc}; the page showed:\n{shown}") from None
    assert engine in settings.engine_ids, engine
    frame.locator(f'button[data-action="restore-{engine}"]').click()
    frame.get_by_role("button", name=f"Confirm: Restore {engine}").click()
    message = frame.locator("#message")
    wait_for(lambda: "DAG run" in message.inner_text(), 30, "the trigger's answer")
    said = message.inner_text()
    assert "is queued, but restore_and_resync is paused" in said, said
    assert "airflow dags unpause restore_and_resync" in said, said
    assert "toggle in Airflow's Dags list" in said, said

    runs = api.get("/api/v2/dags/restore_and_resync/dagRuns").json()["dag_runs"]
    assert [r["conf"] for r in runs] == [{"engine": engine}]
    (run,) = runs
    assert run["triggering_user_name"] == "admin"
    api.delete(f"/api/v2/dags/restore_and_resync/dagRuns/{run['dag_run_id']}").raise_for_status()
