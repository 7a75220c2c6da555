"""The dashboard in a real browser: Debian's Chromium driven by Playwright.

The dashboard is served by ``pgwork dashboard`` (uvicorn) on a free local port; the test
seeds jobs and runs workers through the public client in this process. Each test saves
screenshots under ``$PGWORK_SCREENSHOTS`` (or pytest's tmp dir). Without Chromium or
Playwright the tests skip with a reason starting ``browser unavailable:``; CI installs
both and treats such a skip as a failure.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from tests.dashboard._proxy import relayed
from tests.dashboard._server import served
from tests.dashboard._support import (
    FLAKY_FAILS,
    PROCESSORS,
    SLOW_EVENTS,
    Order,
    echo,
    flaky,
    job_status,
    mail,
    orders,
    retries,
    run_until_settled,
    slow,
    start,
    wait_until,
)

from pgwork import Client, create_in_process_worker
from pgwork.records import ChainStatus, JobStatus

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
USER, PASSWORD = "ops", "correct-horse-battery"
SCRIPT = "<script>window.pwned = true; alert('pwned')</script>"

try:
    from playwright.async_api import Browser, Page, async_playwright, expect
    from playwright.async_api import Error as PlaywrightError
except ImportError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(
        f"browser unavailable: playwright is not installed ({exc})", allow_module_level=True
    )
if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
    pytest.skip(f"browser unavailable: no Chromium at {CHROMIUM}", allow_module_level=True)


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("PGWORK_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def dashboard_url(pgwork_dsn: str) -> Iterator[str]:
    with served(pgwork_dsn, "--auth", f"{USER}:{PASSWORD}") as url:
        yield url


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def page(browser: Browser, dashboard_url: str) -> AsyncIterator[Page]:
    context = await browser.new_context(
        base_url=dashboard_url,
        http_credentials={"username": USER, "password": PASSWORD},
        viewport={"width": 1280, "height": 900},
    )
    opened = await context.new_page()
    opened.on("dialog", lambda dialog: dialog.accept())
    try:
        yield opened
    finally:
        await context.close()


def cell(page: Page, queue: str, column: str) -> Any:
    return page.locator(f'tr[data-queue="{queue}"] td[data-col="{column}"]')


async def test_overview_counts_change_live_while_a_worker_runs(
    client: Client, pgwork_dsn: str, page: Page, shots: Path
) -> None:
    for i in range(20):
        await start(client, pgwork_dsn, echo, f"live {i}")
    await page.goto("/")
    await expect(cell(page, "default", "pending")).to_have_text("20")
    await page.evaluate("window.sameDocument = true")

    worker = create_in_process_worker(client=client, processors=PROCESSORS, poll_interval=0.2)
    async with worker:
        await expect(cell(page, "default", "pending")).to_have_text("0", timeout=30_000)
        await expect(cell(page, "default", "completed-1h")).to_have_text("20", timeout=30_000)
        await expect(page.locator('table[data-testid="workers"] tbody tr')).to_have_count(1)
        await page.screenshot(path=shots / "dashboard-overview.png", full_page=True)

    # The counts changed in the page the test opened: refreshed in place, not reloaded.
    assert await page.evaluate("window.sameDocument") is True


async def test_filter_and_page_through_chains(
    client: Client, pgwork_dsn: str, page: Page, shots: Path
) -> None:
    for i in range(55):
        await start(client, pgwork_dsn, echo, f"chain {i}")
    for i in range(5):
        await start(client, pgwork_dsn, mail, f"mail {i}")
    rows = page.locator('table[data-testid="chains"] tbody tr[data-chain]')

    await page.goto("/chains")
    await page.fill('input[name="type"]', "dash.mail")
    await page.click('form.filters button[type="submit"]')
    await expect(rows).to_have_count(5)
    assert "type=dash.mail" in page.url

    await page.goto("/chains")
    await expect(rows).to_have_count(50)
    first_page = set(await rows.evaluate_all("rs => rs.map(r => r.dataset.chain)"))
    await page.screenshot(path=shots / "dashboard-chains.png", full_page=True)
    await page.click('a[rel="next"]')
    await expect(rows).to_have_count(10)
    second_page = set(await rows.evaluate_all("rs => rs.map(r => r.dataset.chain)"))
    assert not first_page & second_page

    await page.select_option('select[name="status"]', "completed")
    await page.click('form.filters button[type="submit"]')
    await expect(page.locator("text=No chain matches.")).to_be_visible()


async def test_open_a_chain_then_its_job(
    client: Client, pgwork_dsn: str, page: Page, shots: Path
) -> None:
    started = await start(client, pgwork_dsn, echo, "open me")
    await run_until_settled(client, [started.id])

    await page.goto("/chains")
    await page.click(f'tr[data-chain="{started.id}"] td:first-child a')
    await expect(page.locator('[data-testid="chain-status"]')).to_have_text("completed")
    await expect(page.locator('[data-testid="output"]')).to_contain_text("OPEN ME")
    await page.screenshot(path=shots / "dashboard-chain.png", full_page=True)

    await page.click('table[data-testid="chain-jobs"] tbody tr a')
    await expect(page.locator("h1")).to_contain_text(str(started.job_id))
    await expect(page.locator('[data-testid="input"]')).to_contain_text("open me")
    await page.screenshot(path=shots / "dashboard-job.png", full_page=True)


async def test_retry_a_failed_job_and_see_it_run(
    client: Client, pgwork_dsn: str, page: Page, shots: Path
) -> None:
    FLAKY_FAILS["on"] = True
    broken = await start(client, pgwork_dsn, flaky, "retry me")
    await run_until_settled(client, [broken.id])
    FLAKY_FAILS["on"] = False

    await page.goto("/failed")
    await expect(page.locator(f'tr[data-job="{broken.id}"]')).to_contain_text("flaky: retry me")
    await page.screenshot(path=shots / "dashboard-failed.png", full_page=True)
    await page.check(f'input[name="job_id"][value="{broken.id}"]')
    await page.click('#bulk button[type="submit"]')
    await expect(page.locator(".notice")).to_have_text("Retried 1 job.")
    assert await job_status(client, broken.id) is JobStatus.PENDING

    await run_until_settled(client, [broken.id])
    await page.goto(f"/jobs/{broken.id}")
    await expect(page.locator('[data-testid="job-status"]')).to_have_text("completed")


async def test_a_job_page_lists_each_failed_attempt_newest_first(
    client: Client, pgwork_dsn: str, page: Page, shots: Path
) -> None:
    failing = await start(client, pgwork_dsn, retries, "charge card")
    await run_until_settled(client, [failing.id])

    await page.goto(f"/jobs/{failing.job_id}")
    attempts = page.locator('table[data-testid="attempt-history"] tbody tr')
    await expect(attempts).to_have_count(3)
    await expect(attempts.first).to_contain_text("charge card #3")
    await expect(attempts.last).to_contain_text("charge card #1")
    # The picture shows the attempts, not the test's own file paths in the tracebacks.
    await page.evaluate("document.querySelectorAll('details').forEach(d => d.open = false)")
    await page.screenshot(path=shots / "dashboard-attempts.png", full_page=True)


async def test_find_jobs_by_an_input_field_from_the_search_form(
    client: Client, pgwork_dsn: str, page: Page, shots: Path
) -> None:
    wanted = []
    for i in range(12):
        order = Order(user_id=i % 4, email=f"customer{i}@example.com")
        async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
            started = await client.start_chain(conn, orders, order)
            await conn.commit()
        if i % 4 == 2:
            wanted.append(str(started.id))

    await page.goto("/search")
    await page.fill('form[data-testid="input-search"] input[name="type"]', "dash.orders")
    await page.fill('form[data-testid="input-search"] input[name="field"]', "user_id")
    await page.fill('form[data-testid="input-search"] input[name="value"]', "2")
    await page.click('form[data-testid="input-search"] button[type="submit"]')
    rows = page.locator('table[data-testid="input-found"] tbody tr')
    await expect(rows).to_have_count(3)
    await expect(page.locator('[data-testid="search-extent"]')).to_contain_text("3 matched")
    assert "field=user_id" in page.url
    await page.screenshot(path=shots / "dashboard-search.png", full_page=True)


async def test_cancel_a_running_chain(
    client: Client, pgwork_dsn: str, page: Page, shots: Path
) -> None:
    SLOW_EVENTS.clear()
    running = await start(client, pgwork_dsn, slow, "runs until cancelled")
    worker = create_in_process_worker(
        client=client, processors=PROCESSORS, poll_interval=0.2, queues=["slow"]
    )
    async with worker:
        await wait_until(lambda: _is(client, running.id, JobStatus.RUNNING))
        await page.goto(f"/chains/{running.id}")
        await expect(page.locator('[data-testid="chain-status"]')).to_have_text("active")
        await page.screenshot(path=shots / "dashboard-running-chain.png", full_page=True)
        await page.click('button:has-text("Cancel chain")')
        await expect(page.locator('[data-testid="chain-status"]')).to_have_text("cancelled")
        with anyio.fail_after(20):
            await SLOW_EVENTS.setdefault("cancelled", anyio.Event()).wait()

    assert (await client.get_chain(running.id)).status is ChainStatus.CANCELLED


async def _is(client: Client, job_id: Any, status: JobStatus) -> bool:
    return await job_status(client, job_id) is status


async def test_workers_page(client: Client, pgwork_dsn: str, page: Page, shots: Path) -> None:
    await run_until_settled(client, [(await start(client, pgwork_dsn, echo, "w")).id])

    await page.goto("/workers")
    # The worker stopped cleanly when its block ended: grey "stopped", not red "dead".
    await expect(page.locator("tr.stopped")).to_have_count(1)
    await expect(page.locator("tr.dead")).to_have_count(0)
    await page.screenshot(path=shots / "dashboard-workers.png", full_page=True)


async def test_queues_and_jobs_pages_show_work_nobody_takes(
    client: Client, pgwork_dsn: str, page: Page, shots: Path
) -> None:
    for i in range(40):
        await start(client, pgwork_dsn, mail, f"unread {i}")
    for i in range(60):
        await start(client, pgwork_dsn, echo, f"newer {i}")

    await page.goto("/queues")
    await expect(page.locator('tr[data-queue="mail"] [data-testid="no-consumer"]')).to_be_visible()
    await page.screenshot(path=shots / "dashboard-queues.png", full_page=True)
    await page.locator('tr[data-queue="mail"] td a').first.click()
    await expect(page.locator('table[data-testid="jobs"] tbody tr[data-job]')).to_have_count(40)
    await page.screenshot(path=shots / "dashboard-jobs.png", full_page=True)


async def test_history_page_draws_a_day_of_throughput_and_latency(
    client: Client, pgwork_dsn: str, page: Page, shots: Path
) -> None:
    from tests.engine.test_history import seed, workload

    await seed(pgwork_dsn, workload(600))
    while not (await client.roll_up_history()).caught_up:
        pass
    blocked: list[str] = []
    page.on(
        "console",
        lambda message: (
            blocked.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )

    await page.goto("/history")
    await expect(page.locator('[data-testid="history-summary"]')).to_contain_text("completed")
    await expect(page.locator('table[data-testid="history-groups"] tbody tr')).to_have_count(6)
    await page.screenshot(path=shots / "dashboard-history.png", full_page=True)
    assert blocked == []  # the page's policy blocked nothing: no inline script or style


async def test_without_credentials_the_browser_is_refused(
    browser: Browser, dashboard_url: str
) -> None:
    context = await browser.new_context(
        base_url=dashboard_url, http_credentials={"username": USER, "password": "wrong"}
    )
    try:
        anonymous = await context.new_page()
        # Chromium shows the 401, or fails the navigation when it gives up on the
        # challenge (versions differ); either way the overview never appears.
        failure = ""
        try:
            shown = await anonymous.goto("/")
        except PlaywrightError as exc:
            failure = str(exc)
        if failure:
            assert "ERR_INVALID_AUTH_CREDENTIALS" in failure
        else:
            assert shown is not None
            assert shown.status == 401
        assert "Overview" not in await anonymous.content()
        response = await context.request.get("/chains", fail_on_status_code=False)
        assert response.status == 401
        assert "Chains" not in await response.text()
    finally:
        await context.close()


async def test_a_form_with_a_forged_token_is_refused(
    client: Client, pgwork_dsn: str, page: Page
) -> None:
    target = await start(client, pgwork_dsn, mail, "do not cancel")

    await page.goto(f"/chains/{target.id}")
    await page.evaluate(
        "document.querySelectorAll('input[name=csrf]').forEach(i => i.value = 'forged')"
    )
    await page.click('button:has-text("Cancel chain")')

    await expect(page.locator('[data-testid="error-message"]')).to_contain_text("security token")
    assert (await client.get_chain(target.id)).status is ChainStatus.ACTIVE


async def test_a_script_in_a_payload_and_an_error_is_shown_as_text(
    client: Client, pgwork_dsn: str, page: Page, shots: Path
) -> None:
    FLAKY_FAILS["on"] = True
    broken = await start(client, pgwork_dsn, flaky, SCRIPT)
    await run_until_settled(client, [broken.id])
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))

    for path in [f"/jobs/{broken.id}", "/failed", f"/chains/{broken.id}"]:
        await page.goto(path)
        assert await page.evaluate("window.pwned === undefined")
        assert await page.evaluate("document.scripts.length") == 1

    await page.goto(f"/jobs/{broken.id}")
    await expect(page.locator('[data-testid="input"]')).to_contain_text(SCRIPT)
    await expect(page.locator('[data-testid="error-message"]')).to_contain_text(SCRIPT)
    await page.screenshot(path=shots / "dashboard-escaped.png", full_page=True)
    assert dialogs == []
    assert re.search(r"<script>window\.pwned", await page.content()) is None


async def _authenticated_page(browser: Browser, url: str, width: int = 1280) -> Page:
    context = await browser.new_context(
        base_url=url,
        http_credentials={"username": USER, "password": PASSWORD},
        viewport={"width": width, "height": 900},
    )
    return await context.new_page()


async def test_a_page_whose_database_went_silent_shows_its_data_as_stale(
    browser: Browser, client: Client, pgwork_dsn: str, shots: Path
) -> None:
    await start(client, pgwork_dsn, echo, "seen before the outage")
    with relayed(pgwork_dsn) as (dsn, relay), served(dsn, "--auth", f"{USER}:{PASSWORD}") as url:
        page = await _authenticated_page(browser, url)
        try:
            await page.goto("/")
            rendered = page.locator("footer [data-rendered]")
            first = await rendered.text_content()
            # Each refresh brings the footer's time along with the data.
            await expect(rendered).not_to_have_text(first or "", timeout=20_000)

            relay.cut()
            banner = page.locator("#stale")
            await expect(banner).to_be_visible(timeout=30_000)
            # The server gave up on its own bound and said so (a 503), before the
            # browser's bound; the page keeps its last data and says from when.
            await expect(banner).to_contain_text("HTTP 503")
            await expect(banner).to_contain_text("no answer within 5 s")
            await expect(banner).to_contain_text(
                f"Showing data from {await rendered.text_content()}"
            )
            await expect(cell(page, "default", "pending")).to_have_text("1")
            assert await page.evaluate("document.body.dataset.refresh") == "stale"
            await page.screenshot(path=shots / "dashboard-stale.png", full_page=True)

            answer = await page.context.request.get("/workers", timeout=20_000)
            assert answer.status == 503
            assert "Database not answering" in await answer.text()
        finally:
            await page.context.close()


async def test_refreshes_wait_for_each_other_and_back_off_while_failing(
    client: Client, pgwork_dsn: str, page: Page
) -> None:
    await page.goto("/")
    held: list[Any] = []

    async def hold(route: Any) -> None:
        held.append(route)  # never answered: the browser's own bound gives up on it

    await page.route(re.compile(r".*/$"), hold)
    banner = page.locator("#stale")
    await expect(banner).to_contain_text("no answer within 10 s", timeout=30_000)
    # One request in flight for those 10 s, where a timer every 5 s would have sent
    # two or three.
    assert len(held) == 1
    await expect(banner).to_contain_text("next try in 10 s")
    await expect(banner).to_contain_text("next try in 20 s", timeout=40_000)
    assert len(held) == 2


LONG_QUEUE = "q" * 124 + "-end"


async def test_a_long_queue_name_leaves_every_column_on_screen(
    browser: Browser, client: Client, pgwork_dsn: str, dashboard_url: str, shots: Path
) -> None:
    assert len(LONG_QUEUE) == 128
    FLAKY_FAILS["on"] = True
    broken = await start(client, pgwork_dsn, flaky, "x" * 300, queue=LONG_QUEUE)
    worker = create_in_process_worker(
        client=client, processors=PROCESSORS, poll_interval=0.2, queues=[LONG_QUEUE, "q" * 128]
    )
    async with worker:
        await wait_until(lambda: _is(client, broken.id, JobStatus.FAILED))
    await start(client, pgwork_dsn, mail, "waiting", queue=LONG_QUEUE)
    await client.pause_queue("q" * 128)
    page = await _authenticated_page(browser, dashboard_url, width=1400)
    try:
        checks = {
            "/": ['tr[data-queue] td[data-col="state"]', "tr[data-queue] td:last-child"],
            "/failed": ["td.error-summary", "tr[data-job] td:nth-child(5)"],
            "/workers": ["tr[data-worker] td:last-child"],
            "/chains": ["tr[data-chain] td:nth-child(3)", "tr[data-chain] td:last-child"],
        }
        for path, selectors in checks.items():
            await page.goto(path)
            await page.screenshot(path=shots / f"dashboard-long-name{path.replace('/', '-')}.png")
            for selector in selectors:
                cells = page.locator(selector)
                assert await cells.count() > 0, (path, selector)
                for n in range(await cells.count()):
                    box = await cells.nth(n).bounding_box()
                    assert box is not None, (path, selector)
                    assert box["x"] + box["width"] <= 1400, (path, selector, box)
        await page.goto("/")
        name = page.locator(f'tr[data-queue="{LONG_QUEUE}"] a.clip')
        assert await name.get_attribute("title") == LONG_QUEUE
    finally:
        await page.context.close()
