"""The LISTEN connection comes back by itself, and says so, so the worker fetches at once."""

from __future__ import annotations

import anyio
import psycopg
import pytest

from pgwork import Notice, PostgresNotifyAdapter

pytestmark = pytest.mark.anyio


async def test_a_killed_listen_connection_reconnects_and_reports_it(pgwork_dsn: str) -> None:
    adapter = PostgresNotifyAdapter(pgwork_dsn, reconnect_initial=0.05)
    try:
        async with adapter.listen() as listener:
            async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as admin:
                killed = await (
                    await admin.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE query LIKE 'LISTEN %%' AND pid <> pg_backend_pid()"
                        " AND datname = current_database()"
                    )
                ).fetchone()
                assert killed == (1,)
            seen: list[Notice] = []
            with anyio.fail_after(10):
                while Notice(kind="reconnected") not in seen:
                    seen += await listener.wait(1.0)
            # And it listens again: a notice published now arrives.
            await adapter.publish(None, notices=[Notice(kind="ready", queue="q")])
            with anyio.fail_after(10):
                got: list[Notice] = []
                while Notice(kind="ready", queue="q") not in got:
                    got += await listener.wait(1.0)
    finally:
        await adapter.close()


async def test_listening_on_an_unreachable_server_fails_with_a_clear_error() -> None:
    from pgwork import DatabaseUnreachableError

    adapter = PostgresNotifyAdapter("postgresql://nobody:secret@127.0.0.1:1/none")
    with pytest.raises(DatabaseUnreachableError) as err:
        async with adapter.listen():
            pass
    assert "secret" not in str(err.value)
