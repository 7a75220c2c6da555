"""``job_limits``, the run-time overrides of a type's flow limits: one row per type
(``limit_key`` '', the default) and per key of one, a NULL column meaning "as the code
declares", and no row that could not be enforced."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

pytestmark = pytest.mark.anyio


async def _rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        cur = await c.execute(query, params or None)
        return await cur.fetchall() if cur.description else []


async def test_a_type_row_and_key_rows_live_side_by_side(pgwork_dsn: str) -> None:
    await _rows(
        pgwork_dsn, "INSERT INTO pgwork.job_limits (type_name, concurrency) VALUES ('t', 3)"
    )
    await _rows(
        pgwork_dsn,
        "INSERT INTO pgwork.job_limits (type_name, limit_key, key_concurrency, key_rate_n,"
        " key_rate_per_s) VALUES ('t', 'tenant-1', 1, 10, 1.0)",
    )
    rows = await _rows(
        pgwork_dsn,
        "SELECT limit_key, concurrency, key_concurrency, rate_n, key_rate_n, paused_until,"
        " updated_at IS NOT NULL FROM pgwork.job_limits ORDER BY limit_key",
    )
    assert rows == [
        ("", 3, None, None, None, None, True),
        ("tenant-1", None, 1, None, 10, None, True),
    ]
    with pytest.raises(psycopg.errors.UniqueViolation):
        await _rows(pgwork_dsn, "INSERT INTO pgwork.job_limits (type_name) VALUES ('t')")


@pytest.mark.parametrize(
    "values",
    [
        "concurrency = 0",
        "key_concurrency = -1",
        "rate_n = 5",  # a count without its window
        "rate_per_s = 1.0",  # a window without its count
        "rate_n = 0, rate_per_s = 1.0",
        "key_rate_n = 5, key_rate_per_s = 0",
        "key_rate_n = 5",
    ],
)
async def test_a_limit_that_cannot_be_enforced_is_refused(pgwork_dsn: str, values: str) -> None:
    await _rows(pgwork_dsn, "INSERT INTO pgwork.job_limits (type_name) VALUES ('t')")
    with pytest.raises(psycopg.errors.CheckViolation):
        await _rows(pgwork_dsn, f"UPDATE pgwork.job_limits SET {values}")  # a test's own SQL
