"""Unreachable servers, bad DSNs and bad schema names fail with pgwork's own errors."""

from __future__ import annotations

import pytest

from pgwork.errors import DatabaseUnreachableError, InvalidSchemaNameError
from pgwork.postgres import migrate
from pgwork.postgres.connect import connect, redact_dsn
from pgwork.testing import database_dsn

SECRET = "s3cret-pw"
REFUSED = f"postgresql://pgwork:{SECRET}@127.0.0.1:1/pgwork"


def _assert_hidden(err: DatabaseUnreachableError) -> None:
    assert SECRET not in str(err)
    assert SECRET not in err.target
    assert SECRET not in err.reason


@pytest.mark.anyio
async def test_refused_port_raises_unreachable_without_password() -> None:
    with pytest.raises(DatabaseUnreachableError) as err:
        await connect(REFUSED)

    _assert_hidden(err.value)
    assert "127.0.0.1" in err.value.target
    assert "refused" in err.value.reason.lower()


@pytest.mark.anyio
async def test_malformed_dsn_raises_unreachable_without_password() -> None:
    with pytest.raises(DatabaseUnreachableError) as err:
        await connect(f"host=127.0.0.1 password={SECRET} nonsense")

    _assert_hidden(err.value)


@pytest.mark.anyio
async def test_missing_database_raises_unreachable(pg_server_dsn: str) -> None:
    with pytest.raises(DatabaseUnreachableError, match="does not exist"):
        await connect(database_dsn(pg_server_dsn, "pgwork_no_such_database"))


def test_sync_upgrade_and_check_raise_unreachable_without_password() -> None:
    with pytest.raises(DatabaseUnreachableError) as upgrade_err:
        migrate.upgrade(REFUSED)
    with pytest.raises(DatabaseUnreachableError) as check_err:
        migrate.check(REFUSED)

    _assert_hidden(upgrade_err.value)
    _assert_hidden(check_err.value)


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db"),
        (
            "postgresql://u@h/db?password=pw&sslmode=require",
            "postgresql://u@h/db?password=***&sslmode=require",
        ),
        ("host=h password=pw user=u", "host=h password=*** user=u"),
        ("host=h password='p w' user=u", "host=h password=*** user=u"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
    ],
)
def test_redact_dsn_masks_passwords_in_every_form(dsn: str, shown: str) -> None:
    assert redact_dsn(dsn) == shown


@pytest.mark.parametrize(
    "schema", ["", "Pgwork", "pg_jobs", "jobs; DROP TABLE x", "1jobs", "a" * 49]
)
def test_invalid_schema_names_are_rejected_before_connecting(schema: str) -> None:
    with pytest.raises(InvalidSchemaNameError):
        migrate.upgrade(REFUSED, schema=schema)
    with pytest.raises(InvalidSchemaNameError):
        migrate.check(REFUSED, schema=schema)
    with pytest.raises(InvalidSchemaNameError):
        migrate.downgrade(REFUSED, schema=schema)
