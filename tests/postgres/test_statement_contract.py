"""Every named SQL statement of the PostgreSQL adapter is valid against the migrated schema.

The statements are the catalogue ``pgwork.postgres.sql``, rendered once per schema; most run
only on some path (a dedup key, a blocked chain, retention, the dashboard), so a renamed
column or a typo would surface only when a user took that path. Here each one is parsed
and analysed by the server (a protocol-level Prepare, nothing executed) against a schema
migrated to head: an unknown column, table, type or function, or a parameter whose type
the server cannot work out, fails this test by the statement's name.

``COPY`` is not analysed at Prepare (a utility statement), so its column list is checked
as the equivalent ``SELECT``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import psycopg
import pytest

from pgwork.postgres.sql import Statements, render

SCHEMA = "pgwork"

# psycopg's named placeholders (text, binary or automatic format).
_PLACEHOLDER = re.compile(rb"%\((\w+)\)[sbt]")
_COPY = re.compile(rb"^\s*COPY\s+(\S+)\s*\(([^)]*)\)\s*FROM\s+STDIN\s*$", re.IGNORECASE)


def all_statements(schema: str) -> dict[str, bytes]:
    """Every statement of the rendered catalogue, by name."""
    return render(schema).named()


def server_form(query: bytes) -> bytes:
    """``query`` as the server receives it: ``$n`` parameters (one per distinct name, as
    psycopg numbers them) and ``%`` unescaped; a ``COPY`` as the ``SELECT`` of its columns."""
    copy = _COPY.match(query)
    if copy is not None:
        return b"SELECT " + copy.group(2) + b" FROM " + copy.group(1)
    numbers: dict[bytes, int] = {}

    def number(match: re.Match[bytes]) -> bytes:
        return b"$%d" % numbers.setdefault(match.group(1), len(numbers) + 1)

    return _PLACEHOLDER.sub(number, query).replace(b"%%", b"%")


def problems(dsn: str, statements: Mapping[str, bytes]) -> dict[str, str]:
    """The statements the server refuses to prepare, with its message."""
    found = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for index, (name, query) in enumerate(statements.items()):
            result = conn.pgconn.prepare(f"contract_{index}".encode(), server_form(query))
            if result.status != psycopg.pq.ExecStatus.COMMAND_OK:
                message = (result.error_message or b"").decode(errors="replace").strip()
                found[name] = message.splitlines()[0] if message else "refused"
    return found


def test_every_statement_prepares_against_the_migrated_schema(pgwork_dsn: str) -> None:
    statements = all_statements(SCHEMA)
    groups = {name.split(".")[0] for name in statements}
    assert groups == {group.name for group in dataclasses.fields(Statements)}
    assert len(statements) >= 80, sorted(statements)
    assert problems(pgwork_dsn, statements) == {}


@pytest.mark.parametrize(
    ("name", "breakage", "message"),
    [
        ("leases.renew", (b"leased_until", b"leased_til"), "leased_til"),
        ("enqueue.copy_jobs", (b"dedup_key", b"dedupe_key"), "dedupe_key"),
        ("queries.list_jobs", (b"created_at", b"createdat"), "createdat"),
        ("chains.insert_blockers", (b"position", b"pos"), "pos"),
    ],
)
def test_control_a_misspelled_column_is_caught_by_its_statement_name(
    pgwork_dsn: str, name: str, breakage: tuple[bytes, bytes], message: str
) -> None:
    statements = all_statements(SCHEMA)
    broken = statements[name].replace(*breakage)
    assert broken != statements[name]
    found = problems(pgwork_dsn, {**statements, name: broken})
    assert list(found) == [name]
    assert message in found[name]
