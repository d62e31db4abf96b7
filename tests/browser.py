"""Headless Chromium for the browser tests: Debian's ``/usr/bin/chromium`` driven by Playwright.

Never a downloaded browser, and no traffic beyond loopback: the flags turn off Chromium's
background networking (updates, sync, safe browsing), which this machine's closed network would
refuse anyway. Screenshots go to ``$TXN_TEST_ARTIFACTS`` (default ``test-artifacts/``); those the
README and the docs show (:data:`RETAKEN`) also to ``$TXN_README_SCREENSHOTS`` when it is set:
``make screenshots`` sets it to ``docs/screenshots/``, so they show the UI of the code.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(
    os.environ.get("TXN_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "test-artifacts")
)
README_SCREENSHOTS = (
    "airflow-grid",
    "transactions-page",
    "airflow-poison-run",
    "transactions-txid-attempts",
)
"""The screenshots README.md shows (docs/screenshots/<name>.png)."""
DOCS_SCREENSHOTS = {
    "ui.md": ("transactions-rewind-dialog",),
    "changing-a-pipeline.md": ("transactions-filling-output",),
}
"""The screenshots the pages under docs/ show, by page (docs/screenshots/<name>.png too)."""
RETAKEN = README_SCREENSHOTS + tuple(name for names in DOCS_SCREENSHOTS.values() for name in names)
"""Every screenshot ``make screenshots`` retakes into docs/screenshots/."""
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",  # root in a container: Chromium's sandbox needs user namespaces
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost",
]


@contextmanager
def chromium_page(width: int = 1600, height: int = 1000) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        raise RuntimeError(f"{CHROMIUM} is missing: run scripts/system-deps.sh (make install)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(30_000)
            yield page
        finally:
            browser.close()


def login(page: Any, url: str, user: str, password: str) -> None:
    """Sign in through Airflow's login form, as a person would."""
    page.goto(url)
    page.get_by_label(re.compile("username", re.I)).fill(user)
    page.get_by_label(re.compile("password", re.I)).fill(password)
    page.get_by_role("button", name=re.compile("sign in|log in|login", re.I)).click()
    page.wait_for_url(re.compile(r"^(?!.*/auth/login)"))


def screenshot(page: Any, name: str, *, full_page: bool = False) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    readme = os.environ.get("TXN_README_SCREENSHOTS")
    if readme and name in RETAKEN:
        Path(readme).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(readme) / path.name)
    return path


@contextmanager
def screenshot_on_failure(page: Any, name: str) -> Iterator[None]:
    """Keep what the browser showed when a step failed (saved as ``<name>.png``)."""
    try:
        yield
    except BaseException:
        try:
            screenshot(page, name, full_page=True)
        except Exception:  # the browser may be gone: the original error matters more
            pass
        raise
