"""Headless Chromium on the Airflow UI, for the operator page's test and the README's
screenshots: Debian's chromium (`make browser`) driven by playwright, logged in through
Airflow's own login form as a person would."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Browser, FrameLocator, Page

    from twinstream.platform.settings import Settings

CHROMIUM = "/usr/bin/chromium"
# Chromium on this closed network: no background connections, no sandbox as root.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"no {CHROMIUM}: `make browser` installs Debian's chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def admin_password(airflow_home: Path) -> str:
    """The password of Airflow's `admin`, as the simple auth manager generated it."""
    passwords = json.loads(
        (airflow_home / "simple_auth_manager_passwords.json.generated").read_text()
    )
    return str(passwords["admin"])


def log_in(page: Page, airflow_url: str, password: str, user: str = "admin") -> None:
    """Airflow's login form, filled in and sent; returns once the UI is shown."""
    page.goto(f"{airflow_url}/auth/login/")
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/login" not in url, timeout=30_000)


def open_twinstream_page(page: Page, settings: Settings) -> FrameLocator:
    """Log in as Airflow's admin and open the Twinstream page from the navigation, as a
    person does; the frame the page is drawn in."""
    from twinstream.stack.layout import Layout

    log_in(page, settings.airflow_url, admin_password(Layout.of(settings).airflow_home))
    page.get_by_role("link", name="Twinstream").first.click()
    page.wait_for_url("**/plugin/twinstream**")
    return page.frame_locator("iframe")
