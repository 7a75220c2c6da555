"""The limits page and its actions: what runs against each limited type's limit and
what started against its rate, and setting a limit or a rate, pausing a key and
resuming it through POST forms checked for their CSRF token and audited, as the queue
actions are."""

from __future__ import annotations

import re
from datetime import timedelta

import httpx
import pytest
from tests.dashboard._support import act, handle_plain, metered, start, tenant

from pgwork import (
    Client,
    Limits,
    PostgresNotifyAdapter,
    Rate,
    create_client,
    create_in_process_worker,
)
from pgwork.dashboard import allow_any, create_dashboard
from pgwork.observability import DASHBOARD_ACTION, Event

pytestmark = pytest.mark.anyio


async def test_the_page_shows_each_limited_type_with_its_waiting_jobs(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    await start(client, pgwork_dsn, tenant, "one", limit_key="t-1")
    await start(client, pgwork_dsn, tenant, "two", limit_key="t-1")
    await client.pause_limits(tenant, key="t-1", after=timedelta(hours=1))

    page = await http.get("/limits")

    assert page.status_code == 200
    assert 'href="/limits" aria-current="page"' in page.text
    assert 'data-type="dash.tenant"' in page.text
    assert "0 / 3" in page.text
    assert 'data-key="t-1"' in page.text
    assert "Resume" in page.text


def _row(page: str, marker: str) -> str:
    """The table row of the limits page that ``marker`` opens (``data-type="..."``)."""
    found = re.search(rf"<tr {marker}[^>]*>.*?</tr>", page, re.DOTALL)
    assert found, f"no row {marker} on the page"
    return found.group(0)


def _cell(row: str, testid: str) -> str:
    found = re.search(rf'data-testid="{testid}">(.*?)</td>', row, re.DOTALL)
    assert found, f"no {testid} in the row"
    return " ".join(re.sub(r"<[^>]+>", " ", found.group(1)).split())


async def test_the_page_shows_the_attempts_started_against_each_rate(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    """Three attempts of ``dash.metered`` ran to their end: three of the type's ten an
    hour, two of key ``a``'s two (at its rate: marked), one of ``b``'s."""
    chains = [
        await start(client, pgwork_dsn, metered, str(n), limit_key=k)
        for n, k in enumerate(["a", "a", "b"])
    ]
    async with create_in_process_worker(client=client, processors={metered: handle_plain}):
        for chain in chains:
            await client.await_chain(chain.id, timeout=30)

    page = (await http.get("/limits")).text

    row = _row(page, 'data-type="dash.metered"')
    assert _cell(row, "started").startswith("3 / 10 in 1h")
    assert _cell(row, "running").startswith("0 / ∞")
    key_a = _row(page, 'data-key="a"')
    assert _cell(key_a, "key-started") == "2 / 2 in 1h"
    assert "attention" in key_a
    key_b = _row(page, 'data-key="b"')
    assert _cell(key_b, "key-started") == "1 / 2 in 1h"
    assert "attention" not in key_b
    assert _cell(_row(page, 'data-type="dash.tenant"'), "started") == "—"


async def test_set_a_rate_then_return_it_to_the_declaration(
    client: Client, http: httpx.AsyncClient
) -> None:
    """A rate is typed as N/DURATION, the type's or a key's own; blank returns it to
    the declaration."""

    async def status() -> tuple[Limits, dict[str | None, Limits]]:
        [found] = await client.limits(job_type=metered)
        return found.override, {k.limit_key: k.override for k in found.keys}

    done = await act(http, "set_limit", job_type=metered.name, limit="rate", value="5/1m")
    assert done.status_code == 303
    shown = await http.get(done.headers["location"])
    assert "Set rate of dash.metered to 5/1m." in shown.text
    assert (
        await act(
            http, "set_limit", job_type=metered.name, limit_key="a", limit="key_rate", value="1/30s"
        )
    ).status_code == 303
    override, keys = await status()
    assert override.rate == Rate(5, per=timedelta(minutes=1))
    assert keys["a"].key_rate == Rate(1, per=timedelta(seconds=30))
    page = (await http.get("/limits")).text
    assert 'name="value" size="8" value="5/1m"' in _row(page, 'data-type="dash.metered"')

    assert (
        await act(http, "set_limit", job_type=metered.name, limit="rate", value="")
    ).status_code == 303
    assert (await status())[0].rate is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rate", "fast", "rate &#39;fast&#39; is not a rate: give N/DURATION"),
        ("rate", "10/soon", "rate &#39;10/soon&#39; is not a rate"),
        ("key_rate", "0/1s", "key_rate &#39;0/1s&#39; is out of bounds"),
        ("key_rate", "10/2d", "at most 1d"),
    ],
)
async def test_a_rate_that_cannot_be_read_is_refused_naming_its_field(
    client: Client, http: httpx.AsyncClient, field: str, value: str, message: str
) -> None:
    refused = await act(http, "set_limit", job_type=metered.name, limit=field, value=value)
    assert refused.status_code == 409
    assert message in refused.text
    [status] = await client.limits(job_type=metered)
    assert status.override == Limits()


async def test_set_a_limit_then_return_it_to_the_declaration(
    client: Client, http: httpx.AsyncClient
) -> None:
    async def override() -> Limits:
        [status] = await client.limits(job_type=tenant)
        return status.override

    fields = {"job_type": tenant.name, "limit": "concurrency"}
    assert (await act(http, "set_limit", value="7", **fields)).status_code == 303
    assert (await override()).concurrency == 7
    done = await act(http, "set_limit", value="", **fields)
    assert done.status_code == 303
    assert (await override()).concurrency is None
    shown = await http.get(done.headers["location"])
    assert "Set concurrency of dash.tenant to the declared limit." in shown.text


async def test_a_limit_the_client_refuses_shows_its_message(
    client: Client, http: httpx.AsyncClient
) -> None:
    refused = await act(http, "set_limit", job_type=tenant.name, limit="concurrency", value="0")
    assert refused.status_code == 409
    assert "an integer from 1 to 10000" in refused.text
    unknown = await act(http, "pause_limit", job_type="dash.echo", seconds="60")
    assert unknown.status_code == 409
    assert "declares no flow limit" in unknown.text


async def test_pause_a_key_and_resume_it(client: Client, http: httpx.AsyncClient) -> None:
    async def paused() -> bool:
        [status] = await client.limits(job_type=tenant)
        return any(k.limit_key == "t-9" and k.paused for k in status.keys)

    fields = {"job_type": tenant.name, "limit_key": "t-9"}
    assert (await act(http, "pause_limit", seconds="300", **fields)).status_code == 303
    assert await paused()
    assert (await act(http, "resume_limit", **fields)).status_code == 303
    assert not await paused()


async def test_limit_actions_need_the_csrf_token_and_are_audited(
    client: Client, pgwork_dsn: str
) -> None:
    seen: list[Event] = []

    class Recorder:
        def on_event(self, event: Event) -> None:
            seen.append(event)

    audited = create_client(
        state_adapter=client.state,
        notify_adapter=PostgresNotifyAdapter(pgwork_dsn),
        registry=client.registry,
        observers=[Recorder()],
    )
    app = create_dashboard(audited, authorize=allow_any)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as http:
        forged = await http.post(
            "/actions/pause_limit", data={"job_type": tenant.name, "seconds": "60"}
        )
        assert forged.status_code == 403
        rate = {"job_type": metered.name, "limit": "rate", "value": "5/1s"}
        assert (await http.post("/actions/set_limit", data=rate)).status_code == 403
        [status] = await client.limits(job_type=tenant)
        assert not status.paused
        [rated] = await client.limits(job_type=metered)
        assert rated.override.rate is None
        assert (
            await act(http, "pause_limit", job_type=tenant.name, seconds="60")
        ).status_code == 303
        assert (await act(http, "set_limit", **{**rate, "value": "five"})).status_code == 409
        assert (await act(http, "set_limit", **rate)).status_code == 303
    actions = [(e["action"], e["ids"], e["outcome"]) for e in seen if e.name == DASHBOARD_ACTION]
    assert actions == [
        ("pause_limit", (tenant.name,), "forbidden"),
        ("set_limit", (metered.name,), "forbidden"),
        ("pause_limit", (tenant.name,), "done"),
        ("set_limit", (metered.name,), "refused"),
        ("set_limit", (metered.name,), "done"),
    ]
    refused = next(e for e in seen if e.name == DASHBOARD_ACTION and e["outcome"] == "refused")
    assert "rate 'five' is not a rate" in refused["message"]
