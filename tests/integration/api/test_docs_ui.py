"""Swagger UI and ReDoc render in a real browser that can reach nothing but 127.0.0.1.

The real app (``uvicorn maskops_api.main:app`` on the test Postgres, tokens required) is
opened in headless Chromium whose resolver fails every host name, so a page that took its
JavaScript or CSS from a CDN renders nothing and these tests fail. Needs Debian's
``chromium`` and ``chromium-driver`` (``./dev test`` installs them); where they are missing
the tests skip, except under CI (``MASKOPS_REQUIRE_SERVICES=1``), where they fail.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from maskops_core.settings import Settings
from tests.integration.api.conftest import ApiProcess

pytestmark = pytest.mark.integration

HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
CHROME_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    # Every host name fails to resolve: only the loopback server is reachable.
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    "--window-size=1280,1000",
)


def _browser_binaries() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if chromium and chromedriver:
        return chromium, chromedriver
    message = (
        "the docs browser tests need chromium and chromedriver on PATH "
        "(apt-get install chromium chromium-driver; ./dev test installs them)"
    )
    if os.environ.get("MASKOPS_REQUIRE_SERVICES") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def server(api_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The API (the full environment) on a free loopback port, auth required; its URL."""
    work_dir = tmp_path_factory.mktemp("docs_server")
    api = ApiProcess(Path(sys.executable), api_settings, work_dir, {"MASKOPS_AUTH": "required"})
    try:
        client = api.start()
        assert client.get("/datasets").status_code == 401  # tokens required
        yield str(client.base_url).rstrip("/")
        client.close()
    finally:
        api.stop()


@pytest.fixture(scope="module")
def openapi(server: str) -> dict[str, Any]:
    response = httpx.get(f"{server}/openapi.json", timeout=30)
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    chromium, chromedriver = _browser_binaries()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in CHROME_ARGS:
        options.add_argument(argument)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium_profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(
        executable_path=chromedriver,
        log_output=str(tmp_path_factory.mktemp("chromedriver") / "chromedriver.log"),
    )
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver: Any, condition: Callable[[], bool], what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            console = "\n".join(str(entry) for entry in driver.get_log("browser"))
            pytest.fail(
                f"{what} within {timeout:.0f} s at {driver.current_url}\n"
                f"resources: {_resources(driver)}\nbrowser console:\n{console}"
            )
        time.sleep(0.5)


def _resources(driver: Any) -> list[str]:
    names: list[str] = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    return names


def _assert_only_local(driver: Any, base: str) -> None:
    """Every resource the page asked for came from ``base``, but those the page's own
    Content-Security-Policy blocked before any request left the browser (ReDoc's logo)."""
    resources = _resources(driver)
    assert resources, "the page loaded no resource at all"
    foreign = {name for name in resources if not name.startswith(("blob:", "data:", base + "/"))}
    console = [str(entry.get("message", "")) for entry in driver.get_log("browser")]
    blocked = {
        name
        for name in foreign
        for message in console
        if f"'{name}' violates the following Content Security Policy" in message
    }
    assert foreign <= blocked, f"the page fetched resources off the server: {foreign - blocked}"


def test_swagger_ui_renders_every_operation_offline(
    server: str, openapi: dict[str, Any], browser: Any
) -> None:
    expected = {
        (method.upper(), path)
        for path, item in openapi["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }
    assert len(expected) > 10

    def rendered() -> set[tuple[str, str]]:
        pairs: list[list[str]] = browser.execute_script(
            """return Array.from(document.querySelectorAll('.opblock')).map(b => [
                 (b.querySelector('.opblock-summary-method') || {}).textContent || '',
                 (b.querySelector('.opblock-summary-path') || {dataset: {}}).dataset.path || ''])"""
        )
        return {(method.strip().upper(), path) for method, path in pairs}

    browser.get(f"{server}/docs")
    _wait(browser, lambda: expected <= rendered(), "Swagger UI rendered not every operation")
    assert rendered() == expected
    assert "maskops" in browser.find_element("css selector", ".info .title").text
    _assert_only_local(browser, server)


def test_redoc_renders_the_title_and_every_operation_offline(
    server: str, openapi: dict[str, Any], browser: Any
) -> None:
    operation_ids = {
        operation["operationId"]
        for item in openapi["paths"].values()
        for method, operation in item.items()
        if method in HTTP_METHODS
    }

    def sections() -> set[str]:
        ids: list[str] = browser.execute_script(
            """return Array.from(document.querySelectorAll('[data-section-id]'))
                 .map(e => e.getAttribute('data-section-id'))"""
        )
        return {section.rsplit("operation/", 1)[-1] for section in ids if "operation/" in section}

    def title() -> str:
        text: str = browser.execute_script(
            "const h = document.querySelector('.api-info h1, h1'); return h ? h.textContent : ''"
        )
        return text

    browser.get(f"{server}/redoc")
    _wait(browser, lambda: "maskops" in title(), "ReDoc showed no API title")
    _wait(browser, lambda: operation_ids <= sections(), "ReDoc rendered not every operation")
    assert openapi["info"]["title"] in title()
    _assert_only_local(browser, server)
