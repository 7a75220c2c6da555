"""jobs_chain_idx holds continuations only (migration 0005): a chain's root row, found
by primary key, writes no entry there, and continuations stay unique per position."""

from __future__ import annotations

from uuid import UUID, uuid4

import psycopg
import pytest

from pgwork.postgres import migrate

_INSERT = """
INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, chain_index, status,
                         max_attempts, chain_status)
VALUES (%(id)s, 't', %(chain_id)s, 't', %(index)s, 'pending', 1,
        CASE WHEN %(id)s = %(chain_id)s THEN 'active'::pgwork.chain_status END)
"""


def _add_chain(conn: psycopg.Connection, length: int) -> UUID:
    root = uuid4()
    for index in range(length):
        job = root if index == 0 else uuid4()
        conn.execute(_INSERT, {"id": job, "chain_id": root, "index": index})
    return root


def _load(dsn: str) -> None:
    """Ten one-job chains and one chain of three jobs."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(10):
            _add_chain(conn, 1)
        _add_chain(conn, 3)


def _chain_index_entries(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # A rebuild counts the index's entries into reltuples (a VACUUM with nothing to
        # clean up may skip the index and leave it as it was).
        conn.execute("REINDEX INDEX pgwork.jobs_chain_idx")
        row = conn.execute(
            "SELECT reltuples FROM pg_class WHERE oid = 'pgwork.jobs_chain_idx'::regclass"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_only_continuations_have_an_entry_in_the_chain_index(empty_database_dsn: str) -> None:
    migrate.upgrade(empty_database_dsn)
    _load(empty_database_dsn)

    assert _chain_index_entries(empty_database_dsn) == 2


def test_control_before_revision_0005_every_job_has_an_entry(empty_database_dsn: str) -> None:
    migrate.upgrade(empty_database_dsn, revision="0004")
    _load(empty_database_dsn)

    assert _chain_index_entries(empty_database_dsn) == 13


def test_a_position_in_a_chain_takes_one_continuation(pgwork_dsn: str) -> None:
    with psycopg.connect(pgwork_dsn, autocommit=True) as conn:
        root = _add_chain(conn, 2)

        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(_INSERT, {"id": uuid4(), "chain_id": root, "index": 1})


def test_upgrade_and_downgrade_keep_the_rows_and_swap_the_index(empty_database_dsn: str) -> None:
    migrate.upgrade(empty_database_dsn, revision="0004")
    _load(empty_database_dsn)

    def definition() -> str:
        with psycopg.connect(empty_database_dsn) as conn:
            row = conn.execute(
                "SELECT indexdef FROM pg_indexes"
                " WHERE schemaname = 'pgwork' AND indexname = 'jobs_chain_idx'"
            ).fetchone()
        assert row is not None
        return str(row[0])

    migrate.upgrade(empty_database_dsn)
    assert definition().endswith("WHERE (id <> chain_id)")
    assert _chain_index_entries(empty_database_dsn) == 2

    migrate.downgrade(empty_database_dsn, schema="pgwork", revision="0004")
    assert "WHERE" not in definition()
    assert _chain_index_entries(empty_database_dsn) == 13
