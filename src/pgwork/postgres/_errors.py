"""Translating driver errors into pgwork's own, at the adapter edge."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import errors as pg_errors

from pgwork.errors import SchemaMissingError

__all__ = ["translate_errors"]


@contextmanager
def translate_errors(schema: str) -> Iterator[None]:
    """Turn "relation/type/schema does not exist" into SchemaMissingError.

    Other driver errors pass through unchanged: they are real faults (connection lost,
    serialization failure) that the caller handles or retries.
    """
    try:
        yield
    except (
        pg_errors.UndefinedTable,
        pg_errors.UndefinedObject,
        pg_errors.InvalidSchemaName,
        pg_errors.UndefinedFunction,
    ) as exc:
        if schema in str(exc):
            raise SchemaMissingError(schema) from exc
        raise
    except psycopg.Error:
        raise
