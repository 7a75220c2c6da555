"""Who gets in, what every response carries, and escaping of stored text."""

from __future__ import annotations

import base64
import subprocess
import sys

import httpx
import pytest
from starlette.requests import Request
from tests.dashboard._support import breaks, echo, run_until_settled, start

from pgwork import Client
from pgwork.dashboard import BasicAuth, LoginThrottle, TokenAuth, create_dashboard
from pgwork.errors import ConfigurationError

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
