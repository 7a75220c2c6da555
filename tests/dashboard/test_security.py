"""Who gets in, what every response carries, and escaping of stored text."""

from __future__ import annotations

import base64
import logging
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from tests.dashboard._support import (
    act,
    breaks,
    csrf_token,
    echo,
    mail,
    registry,
    run_until_settled,
    start,
)

from pgwork import Client, PostgresStateAdapter, create_client
from pgwork.dashboard import BasicAuth, LoginThrottle, TokenAuth, allow_any, create_dashboard
from pgwork.errors import ConfigurationError, InvalidOptionError
from pgwork.observability import (
    DASHBOARD_ACTION,
    DASHBOARD_AUTH_FAILED,
    Event,
    LoggingObserver,
)

pytestmark = pytest.mark.anyio

SCRIPT = "<script>alert('pwned')</script>"


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"authorization": f"Basic {token}"}


async def statuses(app: object, headers: dict[str, str]) -> list[int]:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        paths = ["/", "/chains", "/workers", "/failed", "/static/dashboard.css", "/nowhere"]
        return [(await http.get(p, headers=headers)).status_code for p in paths]


async def test_basic_auth_refuses_wrong_or_missing_credentials_on_every_path(
    client: Client,
) -> None:
    app = create_dashboard(
        client, authorize=BasicAuth("ops", "s3cret-pass"), login_throttle=LoginThrottle(limit=99)
    )

    assert set(await statuses(app, {})) == {401}
    assert set(await statuses(app, basic("ops", "wrong"))) == {401}
    assert set(await statuses(app, {"authorization": "Basic !!!"})) == {401}
    assert await statuses(app, basic("ops", "s3cret-pass")) == [200, 200, 200, 200, 200, 404]


async def test_the_refusal_asks_the_browser_for_credentials(client: Client) -> None:
    app = create_dashboard(client, authorize=BasicAuth("ops", "s3cret-pass"))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as http:
        response = await http.get("/")

    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Basic ")


async def test_token_auth_takes_a_bearer_token_or_the_basic_password(client: Client) -> None:
    token = "a-long-enough-token-123"
    app = create_dashboard(client, authorize=TokenAuth(token))

    assert set(await statuses(app, {"authorization": f"Bearer {token}"})) <= {200, 404}
    assert set(await statuses(app, basic("anyone", token))) <= {200, 404}
    assert set(await statuses(app, {"authorization": "Bearer nope"})) == {401}


async def test_an_async_authorize_decides_and_a_refusal_without_challenge_is_403(
    client: Client,
) -> None:
    async def only_admins(request: Request) -> bool:
        return request.headers.get("x-role") == "admin"

    app = create_dashboard(client, authorize=only_admins)

    assert set(await statuses(app, {})) == {403}
    assert (await statuses(app, {"x-role": "admin"}))[0] == 200


async def test_authorize_is_required_and_checked(client: Client) -> None:
    with pytest.raises(ConfigurationError, match="allow_any"):
        create_dashboard(client, authorize=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="base_path"):
        create_dashboard(client, authorize=lambda r: True, base_path="jobs")


async def test_pages_carry_security_headers_and_are_not_cached(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    chain = await start(client, pgwork_dsn, echo, "secret payload")

    for path in ["/", "/chains", f"/chains/{chain.id}", f"/jobs/{chain.id}", "/failed"]:
        headers = (await http.get(path)).headers
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp
        assert "unsafe-inline" not in csp
        assert "frame-ancestors 'none'" in csp
        assert headers["x-frame-options"] == "DENY"
        assert headers["cache-control"] == "no-store"
        assert headers["x-content-type-options"] == "nosniff"


async def test_script_in_a_payload_and_in_an_error_is_shown_as_text(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    broken = await start(client, pgwork_dsn, breaks, SCRIPT, dedup=SCRIPT)
    await run_until_settled(client, [broken.id])

    pages = [
        (await http.get(path)).text
        for path in [f"/jobs/{broken.id}", f"/chains/{broken.id}", "/failed", "/chains"]
    ]

    for page in pages:
        assert SCRIPT not in page
        assert "&lt;script&gt;" in page
    # Control: the payload really is in the database as written.
    assert (await client.get_job(broken.id)).input.text == SCRIPT


async def test_script_in_a_queue_name_is_escaped_too(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    await client.pause_queue(SCRIPT)

    page = (await http.get("/")).text

    assert SCRIPT not in page
    assert "&lt;script&gt;" in page


def test_importing_pgwork_does_not_import_starlette() -> None:
    code = (
        "import sys, pgwork, pgwork.client, pgwork.worker\n"
        "leaked = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('starlette', 'jinja2', 'uvicorn') or m.startswith('pgwork.dashboard'))\n"
        "assert not leaked, leaked\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr


# --- the names the dashboard answers to ---------------------------------------------


async def get(app: object, path: str, **options: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        return await http.get(path, **options)


async def test_a_host_the_dashboard_is_not_served_as_gets_nothing(client: Client) -> None:
    app = create_dashboard(client, authorize=allow_any)

    rebound = await get(app, "/failed", headers={"host": "rebind.attacker.example:8321"})
    local = [
        (await get(app, "/failed", headers={"host": name})).status_code
        for name in ("127.0.0.1:8321", "localhost:8321", "[::1]:8321", "LOCALHOST")
    ]

    assert rebound.status_code == 421
    assert "csrf" not in rebound.text
    assert "Failed jobs" not in rebound.text
    assert rebound.headers["x-frame-options"] == "DENY"
    assert local == [200, 200, 200, 200]


async def test_allowed_hosts_names_the_hosts_and_a_star_answers_any(client: Client) -> None:
    named = create_dashboard(client, authorize=allow_any, allowed_hosts=["ops.example.com"])
    pinned = create_dashboard(client, authorize=allow_any, allowed_hosts=["localhost:8321"])
    anything = create_dashboard(client, authorize=allow_any, allowed_hosts=["*"])

    assert (await get(named, "/", headers={"host": "ops.example.com"})).status_code == 200
    assert (await get(named, "/", headers={"host": "localhost"})).status_code == 421
    assert (await get(pinned, "/", headers={"host": "localhost:8321"})).status_code == 200
    assert (await get(pinned, "/", headers={"host": "localhost:9999"})).status_code == 421
    assert (await get(anything, "/", headers={"host": "whatever.test"})).status_code == 200
    for bad in (["https://x.example"], ["a b"], [], ["[::1"]):
        with pytest.raises(ConfigurationError, match="allowed"):
            create_dashboard(client, authorize=allow_any, allowed_hosts=bad)


# --- where state-changing requests may come from ------------------------------------


async def paused(client: Client, queue: str = "mail") -> bool:
    return {c.queue: c.paused for c in await client.count_jobs()}.get(queue, False)


async def test_an_action_from_another_origin_is_refused_even_with_a_valid_token(
    client: Client, http: httpx.AsyncClient
) -> None:
    token = await csrf_token(http)
    form = {"csrf": token, "queue": "mail"}
    forged = [
        {"origin": "http://evil.example"},
        {"origin": "http://localhost.evil.example"},
        {"origin": "null"},
        {"origin": "http://localhost", "sec-fetch-site": "same-site"},
        {"sec-fetch-site": "cross-site"},
    ]

    answers = [await http.post("/actions/pause", data=form, headers=h) for h in forged]

    assert [a.status_code for a in answers] == [403] * len(forged)
    assert all("Cross-site request refused" in a.text for a in answers)
    assert not await paused(client)
    # Control: the dashboard's own page, as a browser sends it, goes through.
    same = {"origin": "http://localhost", "sec-fetch-site": "same-origin"}
    assert (await http.post("/actions/pause", data=form, headers=same)).status_code == 303
    assert await paused(client)


async def test_a_tossed_csrf_cookie_with_the_same_value_in_the_form_is_refused(
    client: Client, http: httpx.AsyncClient
) -> None:
    """A sibling host can set the cookie and post its value: without the server's
    secret, that value is not a token."""
    tossed = "A" * 43  # a well-formed nonce the attacker chose
    http.cookies.set("pgwork_csrf", tossed, domain="localhost.local")
    refused = await http.post(
        "/actions/pause",
        data={"csrf": tossed, "queue": "mail"},
        headers={"cookie": f"pgwork_csrf={tossed}"},
    )

    assert refused.status_code == 403
    assert "security token" in refused.text
    assert not await paused(client)


async def test_a_token_made_for_other_credentials_does_not_verify(client: Client) -> None:
    two_users = create_dashboard(
        client, authorize=lambda request: "authorization" in request.headers
    )
    transport = httpx.ASGITransport(app=two_users)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        http.headers["authorization"] = "Bearer alice"
        token = await csrf_token(http)
        http.headers["authorization"] = "Bearer mallory"
        other = await http.post("/actions/pause", data={"csrf": token, "queue": "mail"})
        http.headers["authorization"] = "Bearer alice"
        own = await http.post("/actions/pause", data={"csrf": token, "queue": "mail"})

    assert other.status_code == 403
    assert own.status_code == 303


async def test_over_https_the_csrf_cookie_is_host_prefixed_and_secure(client: Client) -> None:
    app = create_dashboard(client, authorize=allow_any)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://localhost") as http:
        page = await http.get("/failed")
        found = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert found is not None
        done = await http.post(
            "/actions/pause",
            data={"csrf": found.group(1), "queue": "mail"},
            headers={"origin": "https://localhost"},
        )
        downgraded = await http.post(
            "/actions/pause",
            data={"csrf": found.group(1), "queue": "mail"},
            headers={"origin": "http://localhost"},
        )

    cookie = page.headers["set-cookie"]
    assert cookie.startswith("__Host-pgwork_csrf=")
    assert "Secure" in cookie
    assert "Path=/;" in cookie + ";"
    assert "Domain" not in cookie
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert done.status_code == 303
    assert downgraded.status_code == 403


# --- failed logins -------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_throttle_locks_a_client_out_after_the_limit_then_doubles() -> None:
    clock = Clock()
    throttle = LoginThrottle(limit=3, window=60, lockout=10, max_lockout=25, clock=clock)

    assert [throttle.failed("a") for _ in range(3)] == [False, False, True]
    assert throttle.retry_after("a") == 10
    assert throttle.retry_after("b") is None  # per client
    clock.now += 10
    assert throttle.retry_after("a") is None
    assert [throttle.failed("a") for _ in range(3)] == [False, False, True]
    assert throttle.retry_after("a") == 20  # the second lockout in a row doubles
    clock.now += 20
    assert [throttle.failed("a") for _ in range(3)] == [False, False, True]
    assert throttle.retry_after("a") == 25  # up to max_lockout
    throttle.succeeded("a")
    assert throttle.retry_after("a") is None
    # Failures spread wider than the window do not add up.
    for _ in range(5):
        throttle.failed("c")
        clock.now += 61
        throttle.failed("c")
        clock.now += 61
    assert throttle.retry_after("c") is None


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def on_event(self, event: Event) -> None:
        self.events.append(event)

    def named(self, name: str) -> list[Event]:
        return [e for e in self.events if e.name == name]


@pytest.fixture
async def recorded(pgwork_dsn: str) -> AsyncIterator[tuple[Client, Recorder]]:
    recorder = Recorder()
    state = await PostgresStateAdapter.connect(pgwork_dsn, max_size=4)
    made = create_client(state_adapter=state, registry=registry, observers=[recorder])
    try:
        yield made, recorder
    finally:
        await made.close()


async def test_after_too_many_failed_logins_the_right_password_waits_for_the_window(
    recorded: tuple[Client, Recorder],
) -> None:
    client, recorder = recorded
    clock = Clock()
    app = create_dashboard(
        client,
        authorize=BasicAuth("ops", "s3cret-pass"),
        login_throttle=LoginThrottle(limit=3, lockout=30, clock=clock),
    )

    wrong = [(await get(app, "/", headers=basic("ops", f"guess{i}"))).status_code for i in range(3)]
    locked = await get(app, "/", headers=basic("ops", "s3cret-pass"))
    clock.now += 31
    after = await get(app, "/", headers=basic("ops", "s3cret-pass"))

    assert wrong == [401, 401, 401]
    assert locked.status_code == 429
    assert locked.headers["retry-after"] == "31"
    assert locked.headers["x-frame-options"] == "DENY"
    assert after.status_code == 200
    failures = recorder.named(DASHBOARD_AUTH_FAILED)
    assert [(e["user"], e["locked"]) for e in failures] == [("ops", False)] * 2 + [
        ("ops", True)
    ] * 2
    assert failures[0]["client"] == "127.0.0.1"
    assert failures[0]["path"] == "/"


# --- the audit trail -----------------------------------------------------------------


async def test_every_action_is_audited_with_who_what_and_outcome(
    recorded: tuple[Client, Recorder], pgwork_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    client, recorder = recorded
    chain = await start(client, pgwork_dsn, mail, "audited")
    app = create_dashboard(client, authorize=BasicAuth("ops", "s3cret-pass"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://localhost", auth=("ops", "s3cret-pass")
    ) as http:
        assert (await act(http, "cancel", chain_id=str(chain.id))).status_code == 303
        assert (await act(http, "cancel", chain_id=str(chain.id))).status_code == 409
        forged = await http.post("/actions/delete", data={"chain_id": str(chain.id)})
        assert forged.status_code == 403
        cross = await http.post(
            "/actions/pause", data={"queue": "mail"}, headers={"origin": "http://evil.test"}
        )
        assert cross.status_code == 403

    audit = [
        (e["action"], e["user"], e["ids"], e["outcome"]) for e in recorder.named(DASHBOARD_ACTION)
    ]
    assert audit == [
        ("cancel", "ops", (str(chain.id),), "done"),
        ("cancel", "ops", (str(chain.id),), "refused"),
        ("delete", "ops", (str(chain.id),), "forbidden"),
        ("pause", "ops", (), "forbidden"),
    ]
    events = recorder.named(DASHBOARD_ACTION)
    assert events[0]["client"] == "127.0.0.1"
    assert "already" in events[1]["message"]

    # The default observer writes the same events as log records on pgwork.events.
    logged = LoggingObserver()
    with caplog.at_level(logging.INFO, logger="pgwork.events"):
        for event in events:
            logged.on_event(event)
    assert [r.event for r in caplog.records] == [DASHBOARD_ACTION] * 4  # type: ignore[attr-defined]
    assert caplog.records[0].getMessage().startswith("pgwork dashboard.action action=cancel")


# --- smaller edges -------------------------------------------------------------------


async def test_a_crash_is_a_500_that_still_carries_the_security_headers(
    client: Client,
) -> None:
    def broken() -> Client:
        raise RuntimeError("the application's client factory broke")

    app = create_dashboard(broken, authorize=allow_any)

    response = await get(app, "/")

    assert response.status_code == 500
    assert "the application's client factory broke" not in response.text
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    "path", ["/chains?type=%00", "/failed?queue=a%00b", "/chains?q=%00", "/waiting?signal=a%00"]
)
async def test_a_nul_character_in_a_filter_is_a_bad_request(
    http: httpx.AsyncClient, path: str
) -> None:
    response = await http.get(path)

    assert response.status_code == 400
    assert "NUL" in response.text


async def test_a_database_outage_is_a_503_that_says_so(pgwork_dsn: str, pg_server_dsn: str) -> None:
    state = await PostgresStateAdapter.connect(pgwork_dsn, max_size=2, operation_timeout=2.0)
    made = create_client(state_adapter=state, registry=registry, observers=[])
    app = create_dashboard(made, authorize=allow_any)
    name = psycopg.conninfo.conninfo_to_dict(pgwork_dsn)["dbname"]
    try:
        assert (await get(app, "/chains?type=dash.echo")).status_code == 200
        async with await psycopg.AsyncConnection.connect(pg_server_dsn, autocommit=True) as admin:
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
        # The pooled connection the server just killed fails once with the driver's
        # own error (the state adapter does not translate it); the pool drops it.
        with pytest.raises(Exception, match="terminating connection"):
            await made.count_jobs()
        pages = [await get(app, p) for p in ("/chains?type=dash.echo", "/failed", "/")]
    finally:
        async with await psycopg.AsyncConnection.connect(pg_server_dsn, autocommit=True) as admin:
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await made.close()

    assert [p.status_code for p in pages] == [503, 503, 503]
    assert all("Database unavailable" in p.text for p in pages)
    assert all("Bad filter" not in p.text for p in pages)
    assert pages[0].headers["x-frame-options"] == "DENY"


async def test_the_trailing_slash_redirect_is_relative_and_ignores_host(
    client: Client,
) -> None:
    app = create_dashboard(client, authorize=allow_any, allowed_hosts=["*"])

    moved = await get(app, "/chains/?status=active", headers={"host": "evil.example"})
    doubled = await get(app, "http://localhost//evil.example/")

    assert moved.status_code == 307
    assert moved.headers["location"] == "/chains?status=active"
    assert doubled.headers["location"] == "/evil.example"


async def test_pause_refuses_a_queue_name_with_control_characters(
    client: Client, http: httpx.AsyncClient
) -> None:
    for bad in ("mail\n", "a\x1bb", "\x00", "", " padded"):
        with pytest.raises(InvalidOptionError, match="pause_queue"):
            await client.pause_queue(bad)
    refused = await act(http, "pause", queue="evil\x07bell")

    assert refused.status_code == 409
    assert "printable" in refused.text
    assert [c.queue for c in await client.count_jobs() if c.paused] == []
    # A pause stored before names were checked can still be lifted: resume takes any.
    await client.resume_queue("mail\n")


async def test_the_fastapi_examples_local_only_does_not_trust_forwarded_for() -> None:
    from examples.fastapi_app import local_only
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    async def app(scope: Any, receive: Any, send: Any) -> None:
        allowed = local_only(Request(scope, receive))
        await PlainTextResponse("yes" if allowed else "no")(scope, receive, send)

    # Run as uvicorn --forwarded-allow-ips='*' would: the proxy headers rewrite the client.
    proxied = ProxyHeadersMiddleware(app, trusted_hosts="*")  # type: ignore[arg-type]
    remote = httpx.ASGITransport(app=proxied, client=("203.0.113.7", 40000))  # type: ignore[arg-type]
    local = httpx.ASGITransport(app=proxied, client=("127.0.0.1", 40000))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=remote, base_url="http://localhost") as http:
        spoofed = await http.get("/", headers={"x-forwarded-for": "127.0.0.1"})
    async with httpx.AsyncClient(transport=local, base_url="http://localhost") as http:
        direct = await http.get("/")

    assert spoofed.text == "no"
    assert direct.text == "yes"


async def test_audit_fields_from_the_request_cannot_break_a_log_line(
    recorded: tuple[Client, Recorder],
) -> None:
    client, recorder = recorded
    app = create_dashboard(client, authorize=BasicAuth("ops", "s3cret-pass"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://localhost", auth=("ops", "s3cret-pass")
    ) as http:
        await act(http, "pause", queue="mail\nINFO pgwork dashboard.action outcome=done")
        await get(app, "/", headers=basic("ops\r\nforged", "wrong"))

    (action,) = recorder.named(DASHBOARD_ACTION)
    (failure,) = recorder.named(DASHBOARD_AUTH_FAILED)
    assert action["ids"] == ("'mail\\nINFO pgwork dashboard.action outcome=done'",)
    assert failure["user"] == "'ops\\r\\nforged'"
