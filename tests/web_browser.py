"""A real headless Chromium for the web view's tests and bench: Debian's `chromium` driven through its
`chromium-driver` by Selenium (no browser is downloaded; .ci/test-env.sh installs both with apt).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

T = TypeVar("T")
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def missing() -> str | None:
    """Why no browser can run here, or None."""
    for _name, path in (("chromium", CHROMIUM), ("chromium-driver", DRIVER)):
        if shutil.which(path) is None:
            return f"{path} is missing: apt-get install -y chromium chromium-driver (.ci/test-env.sh does it)"
    return None


@contextmanager
def chromium(width: int = 1600, height: int = 1000, dark: bool = False) -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--hide-scrollbars",
    ):
        options.add_argument(flag)
    if dark:
        options.add_argument("--force-dark-mode")
        options.add_argument("--blink-settings=preferredColorScheme=0")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))
    except WebDriverException:  # a browser that did not come up in time on a busy machine: once more
        driver = webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def until(
    driver: webdriver.Chrome, condition: Callable[[webdriver.Chrome], T], timeout: float = 60, what: str = ""
) -> T:
    """Wait for a condition on the page (the page's own state, never a fixed sleep)."""
    wait = WebDriverWait(driver, timeout, poll_frequency=0.05)
    return wait.until(condition, what)  # type: ignore[no-any-return]


def text_of(driver: webdriver.Chrome, selector: str) -> str:
    found = driver.execute_script(
        f"const n = document.querySelector({selector!r}); return n ? n.textContent : ''"
    )
    return str(found)


def full_page_png(driver: webdriver.Chrome, width: int = 1600) -> bytes:
    """A screenshot of the whole page, not only the window."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(width, min(max(height + 120, 600), 6000))
    png: Any = driver.get_screenshot_as_png()
    return bytes(png)
