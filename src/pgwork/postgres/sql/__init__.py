"""Every SQL statement of the PostgreSQL state adapter: one catalogue, one ``render``.

Each module holds the statements of one concern as named constants (``ACQUIRE``,
``COMPLETE``, ...) beside a frozen dataclass listing them (``LeaseStatements``...):

- ``enqueue``: inserting jobs, announcing ready queues, deduplication;
- ``leases``: acquire, next due, atomic attempts, renew, release, reap;
- ``limits``: acquiring within job types' limits, fairly across limit keys;
- ``limit_control``: limits and pauses changed at run time, and read back;
- ``outcomes``: complete (and its batched turn with the next acquire), fail, reschedule;
- ``chains``: blockers, cancel, retry, trigger, pause, awaiting;
- ``queries``: reads by id, listings, counts, deletion and retention;
- ``work_views``: the operator's views of waiting, running and failed work;
- ``insight``: recent activity and chain links;
- ``history``: rolling ended jobs up into the history, and reading it;
- ``signals``: signals, the steps that wait for them, and matching the two;
- ``waiting``: what chains wait for, and the listings of waiting steps and signals;
- ``workers``: the worker registry.

Statements are templates: ``{jobs}``, ``{queues}``, ``{workers}``... stand for the
schema's tables and types, ``{lease_line}``, ``{limit_lock}`` and ``{signal_lock}`` for
advisory locks' first keys. ``render``
fills them in once per schema, with the schema name composed by ``psycopg.sql``;
everything a caller supplies is a bound parameter. The statement contract test prepares
every statement of the catalogue against a migrated database.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any, get_type_hints

from psycopg import sql

from pgwork.postgres._names import validate_schema_name
from pgwork.postgres.sql.chains import ChainStatements
from pgwork.postgres.sql.enqueue import EnqueueStatements
from pgwork.postgres.sql.history import HistoryStatements
from pgwork.postgres.sql.insight import InsightStatements
from pgwork.postgres.sql.leases import LEASE_LINE_LOCK, LeaseStatements
from pgwork.postgres.sql.limit_control import LimitControlStatements
from pgwork.postgres.sql.limits import LIMIT_LOCK, LimitStatements
from pgwork.postgres.sql.outcomes import OutcomeStatements
from pgwork.postgres.sql.queries import QueryStatements
from pgwork.postgres.sql.signals import SIGNAL_LOCK, SignalStatements
from pgwork.postgres.sql.waiting import WaitingStatements
from pgwork.postgres.sql.work_views import WorkViewStatements
from pgwork.postgres.sql.workers import WorkerStatements

__all__ = ["Statements", "render"]

# The schema's tables and types the templates name.
_SCHEMA_OBJECTS = (
    "jobs",
    "queues",
    "job_blockers",
    "workers",
    "job_history",
    "job_history_progress",
    "job_limits",
    "job_starts",
    "signals",
    "job_status",
    "chain_status",
)


@dataclass(frozen=True, slots=True)
class Statements:
    """The whole catalogue for one schema, by concern, as bytes.

    Bytes (not ``sql.Composed``) so psycopg sees the same query text each time and its
    automatic prepared statements kick in.
    """

    enqueue: EnqueueStatements
    leases: LeaseStatements
    limits: LimitStatements
    limit_control: LimitControlStatements
    outcomes: OutcomeStatements
    chains: ChainStatements
    queries: QueryStatements
    work_views: WorkViewStatements
    insight: InsightStatements
    history: HistoryStatements
    signals: SignalStatements
    waiting: WaitingStatements
    workers: WorkerStatements

    def named(self) -> dict[str, bytes]:
        """Every statement by name: ``group.name``, or ``group.name[key]`` for a
        statement of a mapping (for the contract test, traces and plans)."""
        found: dict[str, bytes] = {}
        for group in fields(self):
            statements = getattr(self, group.name)
            for field in fields(statements):
                value = getattr(statements, field.name)
                if isinstance(value, Mapping):
                    for key, query in value.items():
                        found[f"{group.name}.{field.name}[{key}]"] = query
                else:
                    found[f"{group.name}.{field.name}"] = value
        return found


@lru_cache(maxsize=32)
def render(schema: str) -> Statements:
    """Fill every template of the catalogue with ``schema``'s quoted identifiers.

    A group's field ``x`` is its module's constant ``X``: a template, or a mapping of
    templates (rendered into a mapping of the same keys)."""
    schema = validate_schema_name(schema)
    names: dict[str, sql.Composable] = {
        name: sql.Identifier(schema, name) for name in _SCHEMA_OBJECTS
    }
    names["lease_line"] = sql.Literal(LEASE_LINE_LOCK)
    names["limit_lock"] = sql.Literal(LIMIT_LOCK)
    names["signal_lock"] = sql.Literal(SIGNAL_LOCK)

    def fill(template: str) -> bytes:
        return sql.SQL(template).format(**names).as_bytes(None)

    def group(cls: type[Any]) -> Any:
        module = sys.modules[cls.__module__]
        rendered: dict[str, Any] = {}
        for field in fields(cls):
            template = getattr(module, field.name.upper())
            if isinstance(template, Mapping):
                rendered[field.name] = {key: fill(text) for key, text in template.items()}
            else:
                rendered[field.name] = fill(template)
        return cls(**rendered)

    return Statements(**{name: group(cls) for name, cls in get_type_hints(Statements).items()})
