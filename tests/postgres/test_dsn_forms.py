"""A DATABASE_URL in SQLAlchemy or platform form works wherever pgwork takes a DSN."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pgwork import PostgresNotifyAdapter, PostgresStateAdapter
from pgwork.adapters.notify import Notice
from pgwork.cli import main
from pgwork.postgres import migrate
from pgwork.postgres.connect import normalize_dsn

FORMS = ["postgresql+psycopg", "postgresql+asyncpg", "postgres", "postgresql+psycopg2"]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql+psycopg://u:p@h:5/db", "postgresql://u:p@h:5/db"),
        ("postgresql+asyncpg://u@h/db?ssl=require", "postgresql://u@h/db?sslmode=require"),
        ("postgres://u@h/db", "postgresql://u@h/db"),
        ("POSTGRES+ASYNCPG://u@h/db", "postgresql://u@h/db"),
        ("postgresql://u@h/db?ssl=x", "postgresql://u@h/db?ssl=x"),
        ("host=h dbname=db", "host=h dbname=db"),
    ],
)
def test_normalize_dsn_turns_every_url_form_into_a_libpq_one(given: str, expected: str) -> None:
    assert normalize_dsn(given) == expected


def _as(form: str, dsn: str) -> str:
    assert dsn.startswith("postgresql://")
    return f"{form}://" + dsn.removeprefix("postgresql://")


@pytest.mark.anyio
@pytest.mark.parametrize("form", FORMS)
async def test_adapters_connect_with_a_sqlalchemy_or_platform_url(
    pgwork_dsn: str, form: str
) -> None:
    url = _as(form, pgwork_dsn)
    state = await PostgresStateAdapter.connect(url)
    try:
        assert await state.now() is not None
    finally:
        await state.close()
    notify = PostgresNotifyAdapter(url)
    try:
        async with notify.listen() as listener:
            await notify.publish(None, notices=[Notice("ready", queue="q")])
            assert await listener.wait(5.0)
    finally:
        await notify.close()


@pytest.mark.parametrize("form", FORMS)
def test_migrate_and_cli_take_a_sqlalchemy_or_platform_url(pgwork_dsn: str, form: str) -> None:
    url = _as(form, pgwork_dsn)
    assert migrate.check(url).is_current
    assert not migrate.upgrade(url).changed
    result = CliRunner().invoke(main, ["queues", "--dsn", url])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["queues"], env={"PGWORK_DSN": url})
    assert result.exit_code == 0, result.output
