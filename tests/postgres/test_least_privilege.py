"""pgwork runs under a role with data privileges only, and that role cannot change the
schema.

The role gets exactly what docs/reliability.md lists: USAGE on the pgwork schema,
SELECT/INSERT/UPDATE/DELETE on its tables, USAGE on its types (and sequences, should
a migration ever add one). Migrations run as the schema owner; the application,
client and worker, needs nothing more.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql
from psycopg.conninfo import make_conninfo
from pydantic import BaseModel

from pgwork import (
    Attempt,
    Continue,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    RetryPolicy,
    create_client,
    create_in_process_worker,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SCHEMA = "pgwork"

# The grants docs/reliability.md documents, for role {role}.
GRANTS = """
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role};
GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role};
"""
TYPES = """
SELECT t.typname FROM pg_type AS t JOIN pg_namespace AS n ON n.oid = t.typnamespace
WHERE n.nspname = %s AND t.typtype = 'e'
"""


class Num(BaseModel):
    n: int


@pytest.fixture
async def app_dsn(pgwork_dsn: str) -> AsyncIterator[str]:
    """DSN of a fresh login role holding only the documented grants."""
    role = f"pgwork_app_{secrets.token_hex(4)}"
    password = secrets.token_hex(8)
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as admin:
        await admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(password)
            )
        )
        try:
            names = {"schema": sql.Identifier(SCHEMA), "role": sql.Identifier(role)}
            for statement in filter(None, map(str.strip, GRANTS.split(";"))):
                await admin.execute(sql.SQL(statement).format(**names))
            cur = await admin.execute(TYPES, (SCHEMA,))
            for (type_name,) in await cur.fetchall():
                await admin.execute(
                    sql.SQL("GRANT USAGE ON TYPE {} TO {}").format(
                        sql.Identifier(SCHEMA, type_name), sql.Identifier(role)
                    )
                )
            yield make_conninfo(pgwork_dsn, user=role, password=password)
        finally:
            await admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            await admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


async def test_client_and_worker_run_with_data_privileges_only(app_dsn: str) -> None:
    reg = JobTypeRegistry()
    first = reg.job_type("first", input=Num, continue_with=["second"])
    second = reg.job_type("second", input=Num, entry=False, mode="atomic")
    flaky = reg.job_type(
        "flaky", input=Num, retry=RetryPolicy(initial=timedelta(seconds=0.05)), max_attempts=3
    )

    async def run_first(attempt: Attempt[Num, Any]) -> Continue[Num]:
        return Continue(second, Num(n=attempt.job.input.n + 1))

    async def run_second(attempt: Attempt[Num, Any]) -> int:
        return attempt.job.input.n * 10

    async def run_flaky(attempt: Attempt[Num, Any]) -> str:
        if attempt.job.attempt == 1:
            raise RuntimeError("first attempt fails")
        return "recovered"

    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(app_dsn),
        notify_adapter=PostgresNotifyAdapter(app_dsn),
        registry=reg,
    )
    worker = create_in_process_worker(
        client=client,
        processors={first: run_first, second: run_second, flaky: run_flaky},
        poll_interval=0.2,
    )
    try:
        async with worker:
            async with await psycopg.AsyncConnection.connect(app_dsn) as conn:
                chain = await client.start_chain(conn, first, Num(n=4))
                retried = await client.start_chain(conn, flaky, Num(n=0))
                await conn.commit()
            output = await client.await_chain(chain.id, timeout=20, poll_interval=0.2)
            await client.await_chain(retried.id, timeout=20, poll_interval=0.2)
    finally:
        await client.close()
    assert output == 50
    assert await _job(app_dsn, retried.job_id) == ("completed", 2)


async def _job(dsn: str, job_id: Any) -> Any:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT status::text, attempt FROM pgwork.jobs WHERE id = %s", (job_id,)
        )
        row = await cur.fetchone()
        return tuple(row) if row else None


@pytest.mark.parametrize(
    "ddl",
    [
        "CREATE TABLE pgwork.intruder (x int)",
        "ALTER TABLE pgwork.jobs ADD COLUMN intruder int",
        "DROP TABLE pgwork.jobs",
        "CREATE INDEX ON pgwork.jobs (queue)",
        "TRUNCATE pgwork.jobs",
        "ALTER TYPE pgwork.job_status ADD VALUE 'intruder'",
    ],
)
async def test_the_data_role_cannot_change_the_schema(app_dsn: str, ddl: str) -> None:
    async with await psycopg.AsyncConnection.connect(app_dsn, autocommit=True) as conn:
        with pytest.raises(errors.InsufficientPrivilege):
            await conn.execute(ddl)
