"""A real headless browser for the report: Debian's chromium through its chromedriver (selenium),
with every host name resolving to nothing, so a page that fetched anything would fail to.

    .venv/bin/python -m tests.report.browser OUT.png   # docs/img/report.png from the fixture state
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def missing() -> str | None:
    """Why no browser test can run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.access(path, os.X_OK) or shutil.which(Path(path).name)):
            return f"{path} is not installed (apt-get install chromium chromium-driver; scripts/setup.sh does)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


@dataclass(frozen=True)
class Loaded:
    console: list[dict[str, Any]]  # the browser's console log: level, message
    screenshot: bytes  # PNG of the whole page
    texts: dict[str, str]  # element id -> its text
    sorted_first: str  # the runs table's first run id after clicking its cost header


@contextmanager
def chromium(width: int = 1200, height: int = 900, dark: bool = False) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                '--host-resolver-rules=MAP * ~NOTFOUND', "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(arg)
    if dark:
        options.add_argument("--force-dark-mode")
        options.add_argument("--blink-settings=preferredColorScheme=0")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    profile = tempfile.mkdtemp(prefix="ct-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    service = Service(executable_path=shutil.which("chromedriver") or CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()  # ends chromium and its driver: nothing outlives the test
        shutil.rmtree(profile, ignore_errors=True)


def load(page: Path, ids: tuple[str, ...] = (), dark: bool = False) -> Loaded:
    from selenium.webdriver.common.by import By

    with chromium(dark=dark) as driver:
        driver.get(page.resolve().as_uri())
        deadline = time.monotonic() + 10
        while driver.execute_script("return document.readyState") != "complete" and time.monotonic() < deadline:
            time.sleep(0.05)
        texts = {i: driver.find_element(By.ID, i).text for i in ids}
        full = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(1200, min(int(full) + 40, 6000))
        shot = driver.get_screenshot_as_png()
        first = ""
        if driver.find_elements(By.CSS_SELECTOR, "#runs-table thead th:nth-child(7) button"):
            driver.find_element(By.CSS_SELECTOR, "#runs-table thead th:nth-child(7) button").click()
            first = driver.find_element(By.CSS_SELECTOR, "#runs-table tbody tr:first-child td").text
        console = driver.get_log("browser")
    return Loaded(console, shot, texts, first)


def screenshot_of_fixture(out: Path) -> Path:
    """Build the fixture state in a scratch home, write its report, and photograph the top of it."""
    from selenium.webdriver.common.by import By

    with tempfile.TemporaryDirectory(prefix="ct-report-") as scratch:
        os.environ["CLOUDTRAIN_HOME"] = str(Path(scratch) / "home")
        from cloudtrain.report import write_report
        from cloudtrain.state import StateStore
        from tests.report.fixture import build

        store = StateStore()
        now = time.time()
        build(store, Path(scratch) / "runs", now)
        page = write_report(store, Path(scratch) / "report.html", 0.0, now)
        with chromium(width=1100, height=1500) as driver:
            driver.get(page.as_uri())
            driver.find_element(By.ID, "spend")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(driver.get_screenshot_as_png())
    return out


if __name__ == "__main__":
    print(screenshot_of_fixture(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img/report.png")))
