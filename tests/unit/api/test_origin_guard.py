"""Cross-site request forgery and DNS rebinding against a real uvicorn server on loopback
(no tokens), from httpx and from a real headless Chromium.

The browser opens a page served by another loopback port (another origin) that uploads a
dataset archive with ``fetch`` and with an auto-submitted form, and a page whose origin
is a name the browser resolves to 127.0.0.1 (``rebind.test``: what DNS rebinding gives an
attacker) that reads ``/datasets``. The API must refuse all of them, create nothing, and
still serve its own dashboard.
"""

from __future__ import annotations

import base64
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from maskops_api.main import create_app
from maskops_core.settings import Settings
from tests.unit.api.conftest import ARCHIVE_LAYOUT, RecordingDispatcher, zip_bytes

EVIL = "http://evil.example"


class _Server:
    """``app`` served by uvicorn in a thread on a free loopback port."""

    def __init__(self, settings: Settings) -> None:
        self.port = _free_port()
        config = uvicorn.Config(
            create_app(settings, dispatcher=RecordingDispatcher()),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def api(settings: Settings) -> Iterator[str]:
    with _Server(settings) as url:
        yield url


def _datasets(api: str) -> list[Any]:
    response = httpx.get(f"{api}/datasets", timeout=10)
    assert response.status_code == 200, response.text
    items: list[Any] = response.json()["items"]
    return items


def _upload(api: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(
        f"{api}/datasets/upload",
        data={"name": "csrf"},
        files={"archive": ("d.zip", zip_bytes(ARCHIVE_LAYOUT))},
        headers=headers,
        timeout=30,
    )


def test_other_hosts_and_origins_are_refused(api: str, settings: Settings) -> None:
    port = api.rsplit(":", 1)[1]
    for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.2"):
        response = httpx.get(f"{api}/datasets", headers={"Host": host}, timeout=10)
        assert response.status_code == 400, (host, response.text)
        assert "not a name this server serves" in response.json()["detail"]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
        assert httpx.get(f"{api}/healthz", headers={"Host": host}, timeout=10).status_code == 200

    for headers in (
        {"Origin": EVIL},
        {"Origin": "null"},
        {"Origin": f"http://127.0.0.1:{int(port) + 1}"},  # another port is another origin
        {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},
        {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"},
    ):
        response = _upload(api, headers)
        assert response.status_code == 403, (headers, response.text)
        read = httpx.get(f"{api}/datasets", headers=headers, timeout=10)
        assert read.status_code == 403 and "access-control-allow-origin" not in read.headers
    assert _datasets(api) == []
    assert not [p for p in (settings.data_root / "uploads").glob("*") if p.is_dir()]

    # The server's own pages, clients without Origin, and following a link still work.
    assert _upload(api, {"Origin": api}).status_code == 201
    assert _upload(api, {}).status_code == 201
    navigate = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    assert httpx.get(f"{api}/ui", headers=navigate, timeout=10).status_code == 200
    assert len(_datasets(api)) == 2


def test_consented_origins_get_cors_headers(settings: Settings) -> None:
    consenting = settings.model_copy(update={"cors_origins": ["https://app.example"]})
    with _Server(consenting) as api:
        headers = {"Origin": "https://app.example"}
        read = httpx.get(f"{api}/datasets", headers=headers, timeout=10)
        assert read.status_code == 200
        assert read.headers["access-control-allow-origin"] == "https://app.example"
        assert _upload(api, headers).status_code == 201
        assert _upload(api, {"Origin": EVIL}).status_code == 403


def test_a_server_beyond_loopback_serves_any_name_unless_told(settings: Settings) -> None:
    from maskops_api.middleware.origin_guard import served_hosts

    assert served_hosts(settings.model_copy(update={"host": "0.0.0.0"})) is None
    named = settings.model_copy(update={"host": "0.0.0.0", "allowed_hosts": ["api.example"]})
    assert served_hosts(named) == {"0.0.0.0", "api.example"}
    assert {"localhost", "127.0.0.1", "::1"} <= served_hosts(settings)  # type: ignore[operator]


# --------------------------------------------------------------------------- the browser


ATTACK_PAGE = """<!doctype html><html><body>
<form id="f" method="POST" enctype="multipart/form-data" action="{api}/datasets/upload"
      target="sink"><input name="name" value="csrf-form"><input type="file" name="archive"
      id="archive"></form><iframe name="sink"></iframe>
<script>
const bytes = Uint8Array.from(atob("{archive}"), c => c.charCodeAt(0));
const file = new File([bytes], "d.zip", {{type: "application/zip"}});
const body = new FormData();
body.append("name", "csrf-fetch");
body.append("archive", file);
window.fetchDone = fetch("{api}/datasets/upload", {{method: "POST", mode: "no-cors", body}})
  .then(() => "sent", e => "error " + e);
window.readDone = fetch("{api}/datasets").then(r => r.text(), e => "blocked " + e);
const files = new DataTransfer();
files.items.add(file);
document.getElementById("archive").files = files.files;
document.getElementById("f").submit();
</script></body></html>"""


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from tests.integration.api.test_docs_ui import CHROME_ARGS, _browser_binaries

    chromium, chromedriver = _browser_binaries()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in CHROME_ARGS:
        if argument.startswith("--host-resolver-rules"):
            # rebind.test resolves to 127.0.0.1, as a rebound attacker's name does.
            argument = (
                "--host-resolver-rules=MAP rebind.test 127.0.0.1, " + argument.split("=", 1)[1]
            )
        options.add_argument(argument)
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    service = Service(executable_path=chromedriver, log_output=str(tmp_path / "driver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def attacker(api: str, tmp_path: Path) -> Iterator[str]:
    """A page on another loopback port (another origin) that attacks ``api``."""
    page = ATTACK_PAGE.format(api=api, archive=base64.b64encode(zip_bytes(ARCHIVE_LAYOUT)).decode())
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text(page)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(tmp_path / "site"), **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{site.server_address[1]}/index.html"
    site.shutdown()


def test_a_page_of_another_origin_can_neither_write_nor_read(
    api: str, attacker: str, browser: Any
) -> None:
    browser.get(attacker)
    sent = browser.execute_async_script("window.fetchDone.then(arguments[0])")
    read = browser.execute_async_script("window.readDone.then(arguments[0])")
    assert sent == "sent"  # the browser did send it (no-cors): the server must refuse
    assert read.startswith("blocked"), read
    time.sleep(1)  # the form's request has arrived by now
    assert _datasets(api) == []


def test_a_rebound_name_cannot_read_the_api(api: str, browser: Any) -> None:
    port = api.rsplit(":", 1)[1]
    browser.get(f"http://rebind.test:{port}/healthz")
    # A script of this page is same-origin with the server, by name.
    answer = browser.execute_async_script(
        "fetch('/datasets').then(r => r.text().then(t => arguments[0]([r.status, t])),"
        " e => arguments[0]([0, String(e)]))"
    )
    assert answer[0] == 400 and "not a name this server serves" in answer[1], answer
    # The dashboard by the server's own address still loads its data.
    browser.get(f"{api}/ui/datasets")
    own = browser.execute_async_script(
        "fetch('/datasets').then(r => arguments[0](r.status), e => arguments[0](String(e)))"
    )
    assert own == 200
