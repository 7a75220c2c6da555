"""A PgBouncer in transaction mode in front of the test server, for the whole session.

Skipped, with a reason starting "pgbouncer unavailable:", only where no pgbouncer
binary can be started (CI installs the Debian package, so a skip there is a failure).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pgwork.testing.pgbouncer import PgBouncer, PgBouncerUnavailable, find_pgbouncer, pgbouncer


@pytest.fixture(scope="session")
def transaction_pooler(pg_server_dsn: str) -> Iterator[PgBouncer]:
    """PgBouncer with ``pool_mode=transaction`` (and ``max_prepared_statements=0``)."""
    try:
        find_pgbouncer()
    except PgBouncerUnavailable as exc:
        pytest.skip(str(exc))
    with pgbouncer(pg_server_dsn, pool_mode="transaction") as bouncer:
        yield bouncer


@pytest.fixture
def pooled_dsn(transaction_pooler: PgBouncer, pgwork_dsn: str) -> str:
    """This test's migrated database, through the transaction pooler."""
    return transaction_pooler.dsn_for(pgwork_dsn)
