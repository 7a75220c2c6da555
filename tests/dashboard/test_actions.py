"""Actions over HTTP: each goes through the client API in its own transaction; a
refusal shows the client's message (409), never a 500; the forms carry a CSRF token."""

from __future__ import annotations

import anyio
import httpx
import pytest
from tests.dashboard._proxy import relayed
from tests.dashboard._support import (
    act,
    breaks,
    csrf_token,
    echo,
    job_status,
    mail,
    registry,
    run_until_settled,
    start,
)

from pgwork import Client, PostgresStateAdapter, create_client
from pgwork.dashboard import allow_any, create_dashboard
from pgwork.records import ChainStatus, JobStatus

pytestmark = pytest.mark.anyio


async def test_retry_puts_a_failed_job_back_to_pending(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    broken = await start(client, pgwork_dsn, breaks, "flaky")
    await run_until_settled(client, [broken.id])

    response = await act(http, "retry", job_id=str(broken.id), next=f"/jobs/{broken.id}")

    assert response.status_code == 303
    assert response.headers["location"] == f"/jobs/{broken.id}"
    assert await job_status(client, broken.id) is JobStatus.PENDING
    shown = await http.get(response.headers["location"])
    assert "Retried 1 job." in shown.text


async def test_retrying_a_job_that_did_not_fail_shows_the_clients_refusal(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    waiting = await start(client, pgwork_dsn, echo, "not failed")

    response = await act(http, "retry", job_id=str(waiting.id))

    assert response.status_code == 409
    assert "not failed" in response.text or "pending" in response.text
    assert await job_status(client, waiting.id) is JobStatus.PENDING


async def test_cancel_ends_an_active_chain_and_a_second_cancel_is_refused(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    waiting = await start(client, pgwork_dsn, mail, "cancel me")

    first = await act(http, "cancel", chain_id=str(waiting.id))
    again = await act(http, "cancel", chain_id=str(waiting.id))

    assert first.status_code == 303
    assert (await client.get_chain(waiting.id)).status is ChainStatus.CANCELLED
    assert again.status_code == 409
    assert "cancelled" in again.text


async def test_delete_removes_a_finished_chain_but_refuses_an_active_one(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    done = await start(client, pgwork_dsn, echo, "done")
    await run_until_settled(client, [done.id])
    active = await start(client, pgwork_dsn, mail, "still going")

    deleted = await act(http, "delete", chain_id=str(done.id))
    refused = await act(http, "delete", chain_id=str(active.id))

    assert deleted.status_code == 303
    assert deleted.headers["location"] == "/chains"
    assert (await http.get(f"/chains/{done.id}")).status_code == 404
    assert refused.status_code == 409
    assert "cancel it first" in refused.text
    assert (await client.get_chain(active.id)).status is ChainStatus.ACTIVE


async def test_pause_and_resume_a_queue(client: Client, http: httpx.AsyncClient) -> None:
    async def paused() -> bool:
        return {c.queue: c.paused for c in await client.count_jobs()}.get("mail", False)

    assert (await act(http, "pause", queue="mail")).status_code == 303
    assert await paused()
    assert (await act(http, "resume", queue="mail")).status_code == 303
    assert not await paused()


async def test_an_action_without_the_csrf_token_is_refused_and_changes_nothing(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    waiting = await start(client, pgwork_dsn, mail, "keep me")
    await http.get("/")  # the browser holds the cookie, a forged form lacks the field

    missing = await http.post("/actions/cancel", data={"chain_id": str(waiting.id)})
    wrong = await http.post(
        "/actions/cancel", data={"chain_id": str(waiting.id), "csrf": "forged-token"}
    )

    assert missing.status_code == wrong.status_code == 403
    assert "security token" in missing.text
    assert (await client.get_chain(waiting.id)).status is ChainStatus.ACTIVE
    # Control: the same request with the page's token goes through.
    assert (await act(http, "cancel", chain_id=str(waiting.id))).status_code == 303


async def test_next_never_leaves_the_dashboard(client: Client, http: httpx.AsyncClient) -> None:
    response = await act(http, "pause", queue="q", next="//evil.example/x")

    assert response.headers["location"] == "/"


async def test_read_only_dashboard_shows_no_forms_and_refuses_actions(
    client: Client, pgwork_dsn: str
) -> None:
    broken = await start(client, pgwork_dsn, breaks, "stays failed")
    await run_until_settled(client, [broken.id])
    app = create_dashboard(client, authorize=allow_any, read_only=True)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as http:
        page = await http.get(f"/jobs/{broken.id}")
        response = await act(http, "retry", job_id=str(broken.id))

    assert "Retry job" not in page.text
    assert '<form method="post"' not in page.text
    assert response.status_code == 403
    assert await job_status(client, broken.id) is JobStatus.FAILED


@pytest.mark.parametrize("queue", ["файлы", "郵便"])
async def test_pausing_a_queue_named_beyond_latin_1_answers_with_its_notice(
    client: Client, http: httpx.AsyncClient, queue: str
) -> None:
    async def paused() -> bool:
        return {c.queue: c.paused for c in await client.count_jobs()}.get(queue, False)

    pausing = await act(http, "pause", queue=queue)
    assert pausing.status_code == 303
    assert await paused()
    assert f"Paused queue {queue}." in (await http.get(pausing.headers["location"])).text

    resuming = await act(http, "resume", queue=queue)
    assert resuming.status_code == 303
    assert not await paused()
    assert f"Resumed queue {queue}." in (await http.get(resuming.headers["location"])).text


@pytest.mark.slow  # waits out both bounds, 15 s
async def test_with_the_database_silent_pages_and_actions_answer_503_not_hang(
    pgwork_dsn: str,
) -> None:
    with relayed(pgwork_dsn) as (dsn, relay):
        state = await PostgresStateAdapter.connect(dsn, max_size=2)
        silent = create_client(state_adapter=state, registry=registry, observers=[])
        app = create_dashboard(silent, authorize=allow_any)
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://localhost"
            ) as http:
                token = await csrf_token(http)
                relay.cut()
                page = await http.get("/")
                action = await http.post("/actions/pause", data={"csrf": token, "queue": "q"})
        finally:
            with anyio.move_on_after(5):
                await silent.close()

    # Within the dashboard's bounds (5 s, 10 s), not the client's 30 s operation timeout.
    assert page.status_code == 503
    assert "gave no answer within 5 s" in page.text
    assert action.status_code == 503
    assert "may or may not have been applied" in action.text
