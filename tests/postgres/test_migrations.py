"""The Alembic history builds exactly the schema that ``build_metadata`` describes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from pgwork.postgres import migrate
from pgwork.postgres._names import HEAD_REVISION
from pgwork.postgres.schema import VERSION_TABLE, build_metadata
from pgwork.testing import temporary_database

REPO_ROOT = Path(__file__).resolve().parents[2]


def _autogenerate_diff(dsn: str, schema: str) -> list[Any]:
    def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
        if type_ == "schema":
            return name == schema
        return not (type_ == "table" and name == VERSION_TABLE)

    with migrate.open_connection(dsn) as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "include_schemas": True,
                "include_name": include_name,
                "compare_type": True,
                "compare_server_default": True,
            },
        )
        return list(compare_metadata(context, build_metadata(schema)))


def _catalog(dsn: str, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """What PostgreSQL itself says the schema holds, version table left out."""
    queries = {
        "columns": """
            SELECT table_name, ordinal_position, column_name, data_type, udt_schema, udt_name,
                   is_nullable, column_default
            FROM information_schema.columns
            WHERE table_schema = :s AND table_name <> :v ORDER BY 1, 2""",
        "constraints": """
            SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)
            FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
            WHERE n.nspname = :s AND c.conrelid::regclass::text NOT LIKE '%' || :v
            ORDER BY 1, 2""",
        "indexes": """
            SELECT tablename, indexname, indexdef FROM pg_indexes
            WHERE schemaname = :s AND tablename <> :v ORDER BY 1, 2""",
        "storage": """
            SELECT c.relname, c.reloptions FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = :s AND c.relkind = 'r' AND c.relname <> :v ORDER BY 1""",
        "enums": """
            SELECT t.typname, array_agg(e.enumlabel::text ORDER BY e.enumsortorder)
            FROM pg_type t JOIN pg_enum e ON e.enumtypid = t.oid
            JOIN pg_namespace n ON n.oid = t.typnamespace
            WHERE n.nspname = :s GROUP BY 1 ORDER BY 1""",
    }
    with migrate.open_connection(dsn) as conn:
        return {
            key: [tuple(row) for row in conn.execute(sa.text(q), {"s": schema, "v": VERSION_TABLE})]
            for key, q in queries.items()
        }


def _schemas(dsn: str) -> set[str]:
    with migrate.open_connection(dsn) as conn:
        rows = conn.execute(sa.text("SELECT nspname FROM pg_namespace"))
        return {row[0] for row in rows}


def test_upgrade_of_empty_database_matches_metadata(empty_database_dsn: str) -> None:
    migrate.upgrade(empty_database_dsn)

    assert _autogenerate_diff(empty_database_dsn, "pgwork") == []


def test_migrated_catalog_equals_metadata_create_all(
    empty_database_dsn: str, pg_server_dsn: str
) -> None:
    """Stricter than autogenerate: index predicates, checks and storage parameters too."""
    migrate.upgrade(empty_database_dsn)
    with temporary_database(pg_server_dsn) as reference_dsn:
        with migrate.open_connection(reference_dsn) as conn, conn.begin():
            conn.execute(sa.text('CREATE SCHEMA "pgwork"'))
            build_metadata("pgwork").create_all(conn)
        expected = _catalog(reference_dsn, "pgwork")

    migrated = _catalog(empty_database_dsn, "pgwork")

    assert migrated == expected
    assert len(migrated["indexes"]) == 28  # 8 primary keys + 20 secondary indexes


def test_storage_parameters_are_on_the_jobs_table(pgwork_dsn: str, pgwork_schema: str) -> None:
    jobs = build_metadata(pgwork_schema).tables[f"{pgwork_schema}.jobs"]
    expected = {f"{k}={v}" for k, v in jobs.dialect_options["postgresql"]["with"].items()}
    with migrate.open_connection(pgwork_dsn) as conn:
        reloptions = conn.execute(
            sa.text("SELECT reloptions FROM pg_class WHERE oid = to_regclass(:t)"),
            {"t": f'"{pgwork_schema}".jobs'},
        ).scalar_one()

    assert set(reloptions) == expected
    assert "fillfactor=70" in reloptions


def test_downgrade_to_base_removes_schema_and_upgrade_restores_it(
    empty_database_dsn: str,
) -> None:
    migrate.upgrade(empty_database_dsn)
    migrate.downgrade(empty_database_dsn, schema="pgwork")

    assert "pgwork" not in _schemas(empty_database_dsn)
    assert migrate.current_revision(empty_database_dsn) is None

    migrate.upgrade(empty_database_dsn)

    assert migrate.check(empty_database_dsn).is_current
    assert _autogenerate_diff(empty_database_dsn, "pgwork") == []


def test_downgrade_keeps_a_schema_that_holds_foreign_objects(empty_database_dsn: str) -> None:
    migrate.upgrade(empty_database_dsn)
    with migrate.open_connection(empty_database_dsn) as conn, conn.begin():
        conn.execute(sa.text("CREATE TABLE pgwork.users_own_table (id int)"))

    migrate.downgrade(empty_database_dsn, schema="pgwork")

    assert "pgwork" in _schemas(empty_database_dsn)
    assert _catalog(empty_database_dsn, "pgwork")["enums"] == []
    assert migrate.current_revision(empty_database_dsn) is None


def test_non_default_schema_is_migrated_alone(empty_database_dsn: str) -> None:
    migrate.upgrade(empty_database_dsn, schema="jobs_elsewhere")

    assert _autogenerate_diff(empty_database_dsn, "jobs_elsewhere") == []
    assert "pgwork" not in _schemas(empty_database_dsn)
    assert migrate.check(empty_database_dsn, schema="jobs_elsewhere").is_current
    assert not migrate.check(empty_database_dsn, schema="pgwork").is_current


def test_two_schemas_keep_separate_histories(empty_database_dsn: str) -> None:
    migrate.upgrade(empty_database_dsn, schema="pgwork")
    migrate.upgrade(empty_database_dsn, schema="tenant_b")

    migrate.downgrade(empty_database_dsn, schema="tenant_b")

    assert "tenant_b" not in _schemas(empty_database_dsn)
    assert migrate.check(empty_database_dsn, schema="pgwork").is_current


def test_application_alembic_history_in_public_is_untouched(empty_database_dsn: str) -> None:
    with migrate.open_connection(empty_database_dsn) as conn, conn.begin():
        conn.execute(sa.text("CREATE TABLE public.alembic_version (version_num varchar(32))"))
        conn.execute(sa.text("INSERT INTO public.alembic_version VALUES ('app_rev_1')"))

    migrate.upgrade(empty_database_dsn)
    migrate.downgrade(empty_database_dsn, schema="pgwork")
    migrate.upgrade(empty_database_dsn)

    with migrate.open_connection(empty_database_dsn) as conn:
        app = conn.execute(sa.text("SELECT version_num FROM public.alembic_version")).all()
        ours = conn.execute(sa.text("SELECT version_num FROM pgwork.pgwork_alembic_version")).all()
    assert [tuple(r) for r in app] == [("app_rev_1",)]
    assert [tuple(r) for r in ours] == [(migrate.head_revision(),)]


@pytest.mark.slow
def test_ten_concurrent_migrate_commands_leave_one_schema_at_head(
    empty_database_dsn: str,
) -> None:
    command = [sys.executable, "-m", "pgwork.cli", "migrate", "--dsn", empty_database_dsn]
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(10)
    ]
    results = [(p.wait(timeout=50), *p.communicate()) for p in processes]

    assert [code for code, _, _ in results] == [0] * 10, results
    migrated = [out for _, out, _ in results if "(none) -> " in out]
    assert len(migrated) == 1, results
    assert migrate.current_revision(empty_database_dsn) == migrate.head_revision()
    assert _autogenerate_diff(empty_database_dsn, "pgwork") == []


def _alembic(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PGWORK_DSN", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=REPO_ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=50,
    )


def test_alembic_upgrade_head_at_repo_root_uses_pgwork_dsn(empty_database_dsn: str) -> None:
    result = _alembic(["-x", "schema=from_cli", "upgrade", "head"], PGWORK_DSN=empty_database_dsn)

    assert result.returncode == 0, result.stderr
    assert migrate.check(empty_database_dsn, schema="from_cli").is_current


def test_alembic_falls_back_to_database_url(empty_database_dsn: str) -> None:
    result = _alembic(["upgrade", "head"], DATABASE_URL=empty_database_dsn)

    assert result.returncode == 0, result.stderr
    assert migrate.check(empty_database_dsn).is_current


def test_alembic_without_a_dsn_fails_with_a_hint() -> None:
    result = _alembic(["upgrade", "head"])

    assert result.returncode != 0
    assert "PGWORK_DSN" in result.stderr


def test_offline_sql_creates_schema_tables_and_version_row() -> None:
    result = _alembic(["-x", "schema=offline_s", "upgrade", "head", "--sql"])

    assert result.returncode == 0, result.stderr
    sql_text = result.stdout
    assert "pg_advisory_xact_lock" in sql_text
    assert 'CREATE SCHEMA IF NOT EXISTS "offline_s"' in sql_text
    assert "CREATE TABLE offline_s.pgwork_alembic_version" in sql_text
    assert "CREATE TABLE offline_s.jobs" in sql_text
    assert "fillfactor" in sql_text


def test_the_engine_expects_the_head_revision_of_the_migrations() -> None:
    # The engine checks a database's revision without Alembic, against a constant.
    assert migrate.head_revision() == HEAD_REVISION


def test_script_location_holds_the_head_revision() -> None:
    versions = migrate.script_location() / "versions"

    assert any(p.name.startswith(migrate.head_revision()) for p in versions.glob("*.py"))
