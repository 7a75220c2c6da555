"""Attacks a browser can carry out against ``pgwork dashboard``, run in Chromium.

Chromium's ``--host-resolver-rules`` maps made-up names to 127.0.0.1, where the
dashboard listens, and Playwright answers the attacker's own page at that name: the
browser then holds a page of ``rebind.test`` (or ``evil.dash.test``) whose requests
reach the dashboard exactly as after a real DNS rebinding (or from a real sibling
host). Each test checks what the attack got, and the database: nothing changed.
Without Chromium or Playwright the module skips with a reason starting ``browser
unavailable:``, which CI treats as a failure.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.dashboard._server import served
from tests.dashboard._support import breaks, run_until_settled, start

from pgwork import Client

pytestmark = pytest.mark.anyio

CHROMIUM = os.environ.get("PGWORK_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

try:
    from playwright.async_api import Browser, Route, async_playwright
except ImportError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(
        f"browser unavailable: playwright is not installed ({exc})", allow_module_level=True
    )
if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
    pytest.skip(f"browser unavailable: no Chromium at {CHROMIUM}", allow_module_level=True)


@asynccontextmanager
async def launch(resolver_rules: str, *extra: str) -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[*CHROMIUM_ARGS, f"--host-resolver-rules={resolver_rules}", *extra],
            headless=True,
        )
        try:
            yield browser
        finally:
            await browser.close()


async def paused(client: Client, queue: str) -> bool:
    return {c.queue: c.paused for c in await client.count_jobs()}.get(queue, False)


def attacker_page(body: str) -> Any:
    async def answer(route: Route) -> None:
        await route.fulfill(status=200, content_type="text/html; charset=utf-8", body=body)

    return answer


# Chromium's own defence (Private / Local Network Access) stops a page it counts as
# public from fetching a loopback address; Firefox and Safari have none, and Chromium
# lets a page through once its user grants the permission. Turned off here, so the test
# shows what the dashboard itself does.
NO_LOCAL_NETWORK_CHECKS = [
    "--disable-features=BlockInsecurePrivateNetworkRequests,"
    "PrivateNetworkAccessSendPreflights,PrivateNetworkAccessRespectPreflightResults,"
    "LocalNetworkAccessChecks"
]

# The page an attacker serves as rebind.test, once the name points at 127.0.0.1: it
# reads the failed jobs, takes the CSRF token the page carries, and pauses a queue.
REBINDING_PAGE = """<!doctype html><title>cat pictures</title><script>
(async () => {
  const result = {};
  try {
    const read = await fetch('/failed');
    result.read_status = read.status;
    const text = await read.text();
    result.saw_failed_job = text.includes(%(job)s);
    const token = text.match(/name="csrf" value="([^"]+)"/);
    result.token = token ? token[1] : null;
    const form = new URLSearchParams({csrf: result.token || '', queue: 'mail'});
    const posted = await fetch('/actions/pause', {method: 'POST', body: form});
    result.post_status = posted.status;
  } catch (error) {
    result.error = String(error);
  }
  window.attack = result;
})();
</script>"""


async def test_a_rebinding_page_can_neither_read_the_dashboard_nor_act(
    client: Client, pgwork_dsn: str
) -> None:
    failed = await start(client, pgwork_dsn, breaks, "a payload to steal")
    await run_until_settled(client, [failed.id])
    # The documented default: no credentials, loopback only.
    with served(pgwork_dsn) as url:
        port = url.rsplit(":", 1)[1]
        attack_url = f"http://rebind.test:{port}/cat-pictures"
        async with launch("MAP rebind.test 127.0.0.1", *NO_LOCAL_NETWORK_CHECKS) as browser:
            context = await browser.new_context()
            page = await context.new_page()
            await page.route(
                attack_url, attacker_page(REBINDING_PAGE % {"job": json.dumps(str(failed.id))})
            )
            await page.goto(attack_url)
            await page.wait_for_function("window.attack !== undefined", timeout=20_000)
            result = await page.evaluate("window.attack")
            # Control: the dashboard, opened by its own name in the same browser, works.
            own = await page.goto(f"{url}/failed")
            assert own is not None
            assert own.status == 200

    assert "error" not in result, result
    assert result["read_status"] == 421
    assert result["saw_failed_job"] is False
    assert result["token"] is None
    assert result["post_status"] == 421
    assert not await paused(client, "mail")


# A page of a sibling host: it sets a pgwork_csrf cookie for the parent domain (cookie
# tossing) and posts a pause form carrying the same value.
TOSSED = "T" * 43
TOSSING_PAGE = """<!doctype html><title>hello, neighbour</title>
<form method="post" action="http://dash.test:%(port)s/actions/pause">
<input type="hidden" name="csrf" value="%(tossed)s">
<input type="hidden" name="queue" value="mail">
<input type="hidden" name="next" value="/">
</form>
<script>
document.cookie = "pgwork_csrf=%(tossed)s; domain=dash.test; path=/";
document.forms[0].submit();
</script>"""


async def test_a_sibling_host_tossing_the_csrf_cookie_cannot_pause_a_queue(
    client: Client, pgwork_dsn: str
) -> None:
    with served(pgwork_dsn, "--allowed-host", "dash.test") as url:
        port = url.rsplit(":", 1)[1]
        dashboard = f"http://dash.test:{port}"
        evil = f"http://evil.dash.test:{port}/hello"
        async with launch("MAP dash.test 127.0.0.1, MAP evil.dash.test 127.0.0.1") as browser:
            context = await browser.new_context()
            page = await context.new_page()
            opened = await page.goto(f"{dashboard}/")  # the operator has it open
            assert opened is not None
            assert opened.status == 200
            await page.route(evil, attacker_page(TOSSING_PAGE % {"port": port, "tossed": TOSSED}))
            await page.goto(evil)
            # The form posts itself; the browser then shows the dashboard's answer.
            await page.wait_for_url(lambda address: address.startswith(dashboard))
            await page.wait_for_load_state()
            answer = await page.locator("body").inner_text()
            cookies = await context.cookies(dashboard)

    # The toss itself worked: the browser holds the attacker's cookie for dash.test.
    assert {"name": "pgwork_csrf", "value": TOSSED, "domain": ".dash.test"}.items() <= next(
        c for c in cookies if c["value"] == TOSSED
    ).items()
    assert not await paused(client, "mail")
    # The same-origin check refused it first; the token check would have, too.
    assert "Cross-site request refused" in answer
