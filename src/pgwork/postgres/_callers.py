"""The thin edge between pgwork's statements and a caller's connection.

Every statement is written once, for psycopg (``%(name)s`` placeholders, rendered to
bytes per schema). A caller may hand us something else: a synchronous psycopg
``Connection`` (Django, Flask, scripts) or an ``asyncpg.Connection``. Each is wrapped in
a ``Caller`` with the same three operations (``fetch``, ``execute``, and ``copy`` where
the driver can), so the enqueue, control and read code above runs unchanged on all of
them; psycopg's own ``AsyncConnection`` is used as it is (``fetch`` / ``execute`` below
take either).

``SyncPsycopgCaller``'s methods are coroutines that never suspend: they call psycopg's
blocking API. That is what lets ``Client.start_chain_sync`` drive the very coroutine
``start_chain`` runs, by hand, without an event loop (``pgwork.client._sync``).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, Protocol, overload, runtime_checkable

import psycopg

__all__ = [
    "AsyncpgCaller",
    "Caller",
    "DbConn",
    "SyncPsycopgCaller",
    "can_copy",
    "execute",
    "fetch",
    "kept_cursor",
    "to_numbered",
]


@runtime_checkable
class Caller(Protocol):
    """A caller's connection, inside the caller's transaction, that is not psycopg's
    ``AsyncConnection``. ``copy`` is ``None`` where the driver has no COPY we use."""

    async def fetch(self, query: bytes, params: Mapping[str, Any]) -> list[Sequence[Any]]: ...

    async def execute(self, query: bytes, params: Mapping[str, Any]) -> None: ...

    @property
    def copy(self) -> Callable[[bytes, Iterable[str]], Coroutine[Any, Any, None]] | None: ...


DbConn = psycopg.AsyncConnection[Any] | Caller


async def fetch(
    conn: DbConn, query: bytes, params: Mapping[str, Any], *, prepare: bool | None = None
) -> list[Sequence[Any]]:
    """The rows of ``query`` (none for a statement that returns no rows)."""
    if isinstance(conn, psycopg.AsyncConnection):
        async with conn.cursor() as cur:
            await cur.execute(query, params, prepare=prepare)
            # Not ``cur.description``: it builds a Column object per column.
            result = cur.pgresult
            return await cur.fetchall() if result is not None and result.nfields else []
    return await conn.fetch(query, params)


async def execute(conn: DbConn, query: bytes, params: Mapping[str, Any]) -> None:
    """Run one statement whose rows nobody reads."""
    if isinstance(conn, psycopg.AsyncConnection):
        async with conn.cursor() as cur:
            await cur.execute(query, params)
    else:
        await conn.execute(query, params)


# The attribute under which a caller's psycopg connection keeps pgwork's cursor.
_KEPT_CURSOR = "_pgwork_cursor"


@overload
def kept_cursor(conn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncCursor[Any]: ...


@overload
def kept_cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]: ...


def kept_cursor(conn: Any) -> Any:
    """A cursor kept on ``conn`` (async or not) for pgwork's statements whose rows
    nobody reads, made on first use.

    A new cursor builds an adapters map and a transformer, whose dumpers are then
    looked up anew; psycopg keeps a cursor's transformer while it runs the same query
    object. Between a caller's statements, with the caches cold after each round trip,
    a new cursor was a fifth of what a ``start_chain`` spent beyond a bare ``INSERT``
    (``python -m bench.cpu --only enqueue`` measures it). Sharing it is safe: each
    ``execute`` runs under the connection's lock and resets the cursor first, and nobody
    reads its results. Kept on the connection object itself, a cycle the collector frees
    with it: a cursor refers to its connection, so in a ``WeakKeyDictionary`` it would
    keep its key alive for ever. The cursor's adapters are a copy of the connection's
    when it was made (pgwork's parameters are uuids, strings and ints with explicit
    casts). Where the connection takes no attribute, a new cursor each time.
    """
    cursor = getattr(conn, _KEPT_CURSOR, None)
    if cursor is None or cursor.closed:
        cursor = conn.cursor()
        with contextlib.suppress(AttributeError):
            setattr(conn, _KEPT_CURSOR, cursor)
    return cursor


def can_copy(conn: DbConn) -> bool:
    return isinstance(conn, psycopg.AsyncConnection) or conn.copy is not None


class SyncPsycopgCaller:
    """A synchronous psycopg ``Connection``; its coroutines complete without suspending."""

    __slots__ = ("connection",)

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.connection = connection

    def __repr__(self) -> str:
        return f"SyncPsycopgCaller({self.connection!r})"

    async def fetch(self, query: bytes, params: Mapping[str, Any]) -> list[Sequence[Any]]:
        with self.connection.cursor() as cur:
            cur.execute(query, params)
            result = cur.pgresult
            return list(cur.fetchall()) if result is not None and result.nfields else []

    async def execute(self, query: bytes, params: Mapping[str, Any]) -> None:
        kept_cursor(self.connection).execute(query, params)

    @property
    def copy(self) -> Callable[[bytes, Iterable[str]], Coroutine[Any, Any, None]]:
        return self._copy

    async def _copy(self, statement: bytes, chunks: Iterable[str]) -> None:
        with self.connection.cursor() as cur, cur.copy(statement) as copy:
            for chunk in chunks:
                copy.write(chunk)


class AsyncpgCaller:
    """An ``asyncpg.Connection`` (raw, or the one under SQLAlchemy's asyncpg dialect).

    Statements are converted once each to asyncpg's ``$n`` placeholders. asyncpg hands
    ``json``/``jsonb`` columns back as text where psycopg parses them; the positions of
    such columns are learnt once per statement (a prepare) and parsed here, so the rows
    look the same to the code above. No COPY: large batches take the multi-row INSERT.
    """

    __slots__ = ("connection",)

    copy = None

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def __repr__(self) -> str:
        return f"AsyncpgCaller({self.connection!r})"

    async def fetch(self, query: bytes, params: Mapping[str, Any]) -> list[Sequence[Any]]:
        sql, names = to_numbered(query)
        args = [params[name] for name in names]
        json_columns = _JSON_COLUMNS.get(sql)
        if json_columns is None:
            statement = await self.connection.prepare(sql)
            json_columns = _JSON_COLUMNS[sql] = tuple(
                i
                for i, attribute in enumerate(statement.get_attributes())
                if attribute.type.name in ("json", "jsonb")
            )
            rows = await statement.fetch(*args)
        else:
            rows = await self.connection.fetch(sql, *args)
        if not json_columns:
            return list(rows)
        parsed: list[Sequence[Any]] = []
        for row in rows:
            values = list(row)
            for i in json_columns:
                if isinstance(values[i], str):
                    values[i] = json.loads(values[i])
            parsed.append(values)
        return parsed

    async def execute(self, query: bytes, params: Mapping[str, Any]) -> None:
        sql, names = to_numbered(query)
        await self.connection.execute(sql, *[params[name] for name in names])


# Per converted statement text: which result columns are JSON (a statement's result
# shape does not depend on the connection it runs on).
_JSON_COLUMNS: dict[str, tuple[int, ...]] = {}

_PLACEHOLDER = re.compile(rb"%\((\w+)\)[sbt]|%%")


@lru_cache(maxsize=512)
def to_numbered(query: bytes) -> tuple[str, tuple[str, ...]]:
    """``query`` with psycopg's ``%(name)s`` placeholders (``b``/``t`` too) as ``$n``,
    one number per distinct name, and the names in number order; ``%%`` becomes ``%``."""
    names: list[str] = []

    def number(match: re.Match[bytes]) -> bytes:
        name = match.group(1)
        if name is None:
            return b"%"
        key = name.decode()
        if key not in names:
            names.append(key)
        return b"$%d" % (names.index(key) + 1)

    return _PLACEHOLDER.sub(number, query).decode(), tuple(names)
