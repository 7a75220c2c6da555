"""Mounted in another ASGI app, or served under a proxy's path, links stay inside."""

from __future__ import annotations

import re

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from tests.dashboard._support import csrf_token, mail, start

from pgwork import Client
from pgwork.dashboard import allow_any, create_dashboard

pytestmark = pytest.mark.anyio


def local_links(html: str) -> list[str]:
    return [u for u in re.findall(r'(?:href|src|action)="([^"]+)"', html) if u.startswith("/")]


async def test_mounted_at_a_sub_path_every_link_and_form_stays_under_it(
    client: Client, pgwork_dsn: str
) -> None:
    chain = await start(client, pgwork_dsn, mail, "mounted")
    dashboard = create_dashboard(lambda: client, authorize=allow_any, allowed_hosts=["app"])
    host = Starlette(
        routes=[
            Route("/", lambda request: PlainTextResponse("the app")),
            Mount("/ops/jobs", app=dashboard),
        ]
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=host), base_url="http://app"
    ) as http:
        page = await http.get(f"/ops/jobs/chains/{chain.id}")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
        cancelled = await http.post(
            "/ops/jobs/actions/cancel",
            data={"csrf": token, "chain_id": str(chain.id), "next": f"/chains/{chain.id}"},
        )
        css = await http.get("/ops/jobs/static/dashboard.css")

    assert page.status_code == 200
    links = local_links(page.text)
    assert links
    assert [u for u in links if not u.startswith("/ops/jobs/")] == []
    assert cancelled.status_code == 303
    assert cancelled.headers["location"] == f"/ops/jobs/chains/{chain.id}"
    assert css.headers["content-type"].startswith("text/css")


async def test_base_path_prefixes_links_for_a_proxy_that_strips_it(client: Client) -> None:
    dashboard = create_dashboard(
        client, authorize=allow_any, base_path="/pgwork/", allowed_hosts=["proxied"]
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=dashboard), base_url="http://proxied"
    ) as http:
        page = await http.get("/chains")
        await csrf_token(http)
        cookie = next(c for c in http.cookies.jar if c.name == "pgwork_csrf")

    links = local_links(page.text)
    assert links
    assert [u for u in links if not u.startswith("/pgwork/")] == []
    assert cookie.path == "/pgwork"
