"""``storable``: an outcome the database cannot store, as ``OutcomeNotStorableError``.

A module of its own: the completion's writers (the staged batch, an atomic attempt,
a group's member) import it, and import one another."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from psycopg import errors as pg_errors

from pgwork.adapters.state import Completion
from pgwork.errors import OutcomeNotStorableError
from pgwork.postgres.sql.outcomes import ATOMIC_REFUSED

__all__ = ["storable"]


@contextmanager
def storable(completions: Sequence[Completion]) -> Iterator[None]:
    """Raise ``OutcomeNotStorableError`` for an outcome among ``completions`` that the
    database cannot store: a character its encoding lacks (psycopg encodes in the
    connection's encoding, before sending anything), or a value the server refuses
    (SQLSTATE class 22, e.g. ``\\u0000`` in a JSON string). The job is named when
    there is one; a batch's caller writes its completions one by one to find it."""
    job_id = completions[0].job_id if len(completions) == 1 else None
    try:
        yield
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end]
        reason = f"the database's encoding ({exc.encoding}) has no character {bad!a}"
        raise OutcomeNotStorableError(job_id, reason) from exc
    except pg_errors.DataError as exc:
        if ATOMIC_REFUSED in str(exc):
            raise
        raise OutcomeNotStorableError(job_id, exc.diag.message_primary or str(exc)) from exc
