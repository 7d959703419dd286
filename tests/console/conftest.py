"""The web console in a real headless Chromium (Debian's `chromium` and `chromium-driver`, driven by
Selenium's WebDriver): a browser per test module, pages opened by their route, every console error of the
page collected, and a screenshot of each page checked saved under test-artifacts/console/."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from danube_fast.client import FastProducer
from danube_fast.testing.browser import chromium

ARTIFACTS = Path(os.environ.get("DANUBE_FAST_ARTIFACTS",
                                Path(__file__).resolve().parents[2] / "test-artifacts")) / "console"
WAIT_S = 20.0  # a page on a loaded 2-core machine; a broken page fails within it, with what it showed
# Refusals the tests cause on purpose show as failed loads in the browser's log; nothing else may appear.
EXPECTED_REFUSAL = re.compile(r"Failed to load resource: the server responded with a status of 4\d\d")


@contextlib.asynccontextmanager
async def producing(target: str, topic: str, name: str) -> AsyncIterator[FastProducer]:
    """A fast producer, flushed and closed at the end of the block."""
    producer = await FastProducer.connect(target, topic, name)
    try:
        yield producer
        await producer.flush()
    finally:
        await producer.close()


class Console:
    """A browser on one broker's console: `open` a route and wait until the page rendered."""

    def __init__(self, driver: webdriver.Chrome, base: str, name: str) -> None:
        self.driver = driver
        self.base = base
        self._name = name
        self._shots = 0

    def open(self, route: str, page: str | None = None) -> WebElement:
        """Go to `#/route` and wait for `page` (route's first word by default) to render; <main>."""
        page = page or route.split("?")[0]
        if self.driver.current_url.split("#")[0].rstrip("/") != self.base:
            self.driver.get(self.base + "/#/" + route)
        else:
            # The mark of the page shown goes first, so that the wait cannot see the old page's; the same
            # route again is drawn again (no hashchange).
            self.driver.execute_script(
                "document.getElementById('main').removeAttribute('data-rendered');"
                "if (location.hash === arguments[0]) window.dispatchEvent(new Event('danube-render'));"
                "else location.hash = arguments[0];", "#/" + route)
        return self.rendered(page)

    def rendered(self, page: str) -> WebElement:
        try:
            self._wait().until(lambda d: d.find_element(By.ID, "main").get_attribute("data-rendered") == page)
        except TimeoutException:
            main = self.driver.find_element(By.ID, "main")
            raise AssertionError(f"page {page} did not render within {WAIT_S} s; it shows: "
                                 f"{main.text[:500]!r}") from None
        return self.driver.find_element(By.ID, "main")

    def wait_for(self, css: str, text: str | None = None) -> WebElement:
        def found(d: Any) -> Any:
            for el in d.find_elements(By.CSS_SELECTOR, css):
                if text is None or text in el.text:
                    return el
            return False
        try:
            return self._wait().until(found)
        except TimeoutException:
            raise AssertionError(f"no {css} showing {text!r} within {WAIT_S} s; the page shows: "
                                 f"{self.driver.find_element(By.ID, 'main').text[:800]!r}") from None

    def _wait(self) -> WebDriverWait[Any]:
        # A page draws itself again (the overview every 5 s, a page after an operation): an element read
        # while that happens is gone, and is looked for again.
        return WebDriverWait(self.driver, WAIT_S, ignored_exceptions=[StaleElementReferenceException])

    def read(self, name: str, what: Any) -> Any:
        """`what(element)` of the element `data-test=name`, read again if the page redraws meanwhile."""
        return self._wait().until(lambda d: what(d.find_element(By.CSS_SELECTOR, f'[data-test="{name}"]')))

    def click(self, name: str) -> None:
        """Click the element `data-test=name`, found again if the page redrew it meanwhile."""
        self.read(name, lambda el: el.click() or True)

    def text(self, name: str) -> str:
        return str(self.read(name, lambda el: el.text))

    def rows(self, name: str) -> list[list[str]]:
        """The cells of the table `data-test=name`, row by row."""
        return list(self.read(name, lambda el: [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
                                                for tr in el.find_elements(By.CSS_SELECTOR, "tbody tr")]))

    def texts(self, name: str) -> list[str]:
        """The text of every element `data-test=name`, in page order, all read again if the page redraws
        while they are read (a list of elements read one by one can go stale halfway)."""
        found = self._wait().until(lambda d: ([el.text for el in d.find_elements(
            By.CSS_SELECTOR, f'[data-test="{name}"]')],))  # a 1-tuple: true even when there are none
        return list(found[0])

    def test(self, name: str) -> WebElement:
        return self.wait_for(f'[data-test="{name}"]')

    def all(self, name: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, f'[data-test="{name}"]')

    def shot(self, what: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self._shots += 1
        self.driver.save_screenshot(str(ARTIFACTS / f"console-{self._name}-{self._shots:02d}-{what}.png"))

    def errors(self) -> list[str]:
        """The page's console errors since the last call, but the refusals tests cause on purpose."""
        return [e["message"] for e in self.driver.get_log("browser")
                if e["level"] == "SEVERE" and not EXPECTED_REFUSAL.search(e["message"])]


@pytest.fixture(scope="module")
def driver() -> Iterator[webdriver.Chrome]:
    d = chromium()
    try:
        yield d
    finally:
        d.quit()
