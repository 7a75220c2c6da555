"""The limits page and its actions: what runs against each limited type's limit, and
setting a limit, pausing a key and resuming it through POST forms checked for their
CSRF token and audited, as the queue actions are."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from tests.dashboard._support import act, start, tenant

from pgwork import Client, Limits, PostgresNotifyAdapter, create_client
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
        [status] = await client.limits(job_type=tenant)
        assert not status.paused
        assert (
            await act(http, "pause_limit", job_type=tenant.name, seconds="60")
        ).status_code == 303
    actions = [(e["action"], e["ids"], e["outcome"]) for e in seen if e.name == DASHBOARD_ACTION]
    assert actions == [
        ("pause_limit", (tenant.name,), "forbidden"),
        ("pause_limit", (tenant.name,), "done"),
    ]
