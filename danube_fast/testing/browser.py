"""Debian's headless Chromium (`chromium` and `chromium-driver`, scripts/system-deps.sh) driven by Selenium's
WebDriver: the browser the web console's tests (tests/console) and its benchmark (bench/console.py) use."""

from __future__ import annotations

import os
import shutil

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def chromium(insecure_tls: bool = False) -> webdriver.Chrome:
    """A new headless Chromium with a 1400 x 1000 window that keeps the page's console log; quit() it."""
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not try to download a browser
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    if insecure_tls:
        options.add_argument("--ignore-certificate-errors")  # the test PKI's CA is not the system's
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
