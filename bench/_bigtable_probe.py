"""What ``python -m bench.bigtable`` reads off the server: sizes, table statistics,
storage settings, and a timed ``VACUUM`` with what it says it did.

Statistics come from ``pg_stat_user_tables``, which a backend updates when its
transaction ends, at most once a second: ``table_stats`` is read after the writing
connection closed and a second passed (``settle_stats``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import anyio
import psycopg
from psycopg import sql

from bench._pgwork_app import SCHEMA

__all__ = [
    "TableStats",
    "Vacuum",
    "relation_sizes",
    "reloptions",
    "settle_stats",
    "table_stats",
    "vacuum",
]

# Every relation of the schema: each table's total (heap, TOAST, indexes) and each
# index alone, tables first, biggest first.
_SIZES = """
SELECT c.relname, c.relkind::text,
       CASE WHEN c.relkind = 'r' THEN pg_total_relation_size(c.oid)
            ELSE pg_relation_size(c.oid) END,
       COALESCE(t.relname, c.relname)
FROM pg_class AS c
LEFT JOIN pg_index AS i ON i.indexrelid = c.oid
LEFT JOIN pg_class AS t ON t.oid = i.indrelid
WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind IN ('r', 'i')
ORDER BY c.relkind DESC, 3 DESC, 1
"""

_RELOPTIONS = """
SELECT relname, COALESCE(array_to_string(reloptions, ', '), '')
FROM pg_class
WHERE relnamespace = %(schema)s::regnamespace AND relkind = 'r'
ORDER BY relname
"""

_STATS = """
SELECT n_live_tup, n_dead_tup, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del,
       vacuum_count, autovacuum_count, analyze_count, autoanalyze_count,
       pg_relation_size(relid)
FROM pg_stat_user_tables
WHERE relid = %(table)s::regclass
"""


@dataclass(frozen=True)
class TableStats:
    """One table's line of ``pg_stat_user_tables``, and its heap's size in bytes."""

    live: int
    dead: int
    inserted: int
    updated: int
    hot_updated: int
    deleted: int
    vacuums: int
    autovacuums: int
    analyzes: int
    autoanalyzes: int
    heap_bytes: int

    def since(self, before: TableStats) -> dict[str, int]:
        """The counters' change since ``before``."""
        return {
            "inserted": self.inserted - before.inserted,
            "updated": self.updated - before.updated,
            "hot_updated": self.hot_updated - before.hot_updated,
            "deleted": self.deleted - before.deleted,
            "vacuums": self.vacuums - before.vacuums,
            "autovacuums": self.autovacuums - before.autovacuums,
            "analyzes": self.analyzes - before.analyzes,
            "autoanalyzes": self.autoanalyzes - before.autoanalyzes,
        }


def relation_sizes(dsn: str) -> dict[str, tuple[str, int]]:
    """Each table (total size) and index (its own) of pgwork's schema: name ->
    (``table`` or the table an index is of, bytes)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(_SIZES, {"schema": SCHEMA}).fetchall()
    return {
        name: ("table" if kind == "r" else f"index of {of}", int(size))
        for name, kind, size, of in rows
    }


def reloptions(dsn: str) -> dict[str, str]:
    """Each table of pgwork's schema and its storage settings (``''``: none)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return dict(conn.execute(_RELOPTIONS, {"schema": SCHEMA}).fetchall())


def table_stats(dsn: str, table: str = "jobs") -> TableStats:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(_STATS, {"table": f"{SCHEMA}.{table}"}).fetchone()
    assert row is not None
    return TableStats(*(int(v) for v in row))


async def settle_stats() -> None:
    """Wait out the backends' statistics flush (at most once a second)."""
    await anyio.sleep(1.2)


@dataclass
class Vacuum:
    """One ``VACUUM (VERBOSE)`` of a table: how long it took, the dead tuples the
    statistics counted before and after, and what its report says of the table (not
    of its TOAST table): index passes, dead item identifiers removed (tuples the
    drain's own page pruning had already cut down count here, not as tuples
    removed), pages scanned of the total."""

    seconds: float
    dead_before: int
    dead_after: int
    index_scans: int | None = None
    dead_items: int | None = None
    pages_scanned: int | None = None
    pages: int | None = None
    report: list[str] = field(default_factory=list)


_INDEX_SCANS = re.compile(r"index scans: (\d+)")
_DEAD_ITEMS = re.compile(r"had (\d+) dead item identifiers removed")
_PAGES = re.compile(r"pages: \d+ removed, (\d+) remain, (\d+) scanned")


def _first(pattern: re.Pattern[str], text: str, group: int = 1) -> int | None:
    found = pattern.search(text)
    return int(found.group(group)) if found else None


async def vacuum(dsn: str, table: str = "jobs", *, analyze: bool = False) -> Vacuum:
    """``VACUUM (VERBOSE)`` ``table`` of pgwork's schema, timed, between two readings
    of its dead tuples."""
    await settle_stats()
    before = table_stats(dsn, table)
    report: list[str] = []
    options = sql.SQL("VERBOSE, ANALYZE" if analyze else "VERBOSE")
    statement = sql.SQL("VACUUM ({}) {}").format(options, sql.Identifier(SCHEMA, table))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda notice: report.append(notice.message_primary or ""))
        started = time.perf_counter()
        conn.execute(statement)
        seconds = time.perf_counter() - started
    await settle_stats()
    after = table_stats(dsn, table)
    # The table's own block of the report, before its TOAST table's.
    own = "\n".join(report).split("pg_toast.", 1)[0]
    return Vacuum(
        seconds=seconds,
        dead_before=before.dead,
        dead_after=after.dead,
        index_scans=_first(_INDEX_SCANS, own),
        dead_items=_first(_DEAD_ITEMS, own),
        pages_scanned=_first(_PAGES, own, 2),
        pages=_first(_PAGES, own, 1),
        report=report,
    )
