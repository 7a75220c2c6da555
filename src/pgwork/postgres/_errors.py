"""Translating driver errors into pgwork's own, at the adapter edge.

By SQLSTATE, not by exception class, so that an error raised by asyncpg (a caller's
connection, ``_callers.AsyncpgCaller``) is translated exactly as psycopg's is: both
drivers put the server's code on the exception as ``sqlstate``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pgwork.errors import SchemaMissingError

__all__ = ["missing_schema", "translate_errors"]

# undefined_table, undefined_object (a type), invalid_schema_name, undefined_function
_MISSING = frozenset({"42P01", "42704", "3F000", "42883"})


@contextmanager
def translate_errors(schema: str) -> Iterator[None]:
    """Turn "relation/type/schema does not exist" naming ``schema`` into
    SchemaMissingError.

    Other driver errors pass through unchanged: they are real faults (connection lost,
    serialization failure) that the caller handles or retries.
    """
    try:
        yield
    except Exception as exc:
        missing = missing_schema(exc, schema)
        if missing is not None:
            raise missing from exc
        raise


def missing_schema(exc: BaseException, schema: str) -> SchemaMissingError | None:
    """The SchemaMissingError ``exc`` means, if it says ``schema`` is missing (for a hot
    path's own ``except``, where ``translate_errors``'s generator would cost a call)."""
    if getattr(exc, "sqlstate", None) in _MISSING and schema in str(exc):
        return SchemaMissingError(schema)
    return None
