"""Small synchronous reads of a scenario's database."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg

__all__ = ["eventually", "fetch", "scalar"]


def fetch(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(query, params or None).fetchall()]


def scalar(dsn: str, query: str, *params: Any) -> Any:
    rows = fetch(dsn, query, *params)
    return rows[0][0] if rows else None


def eventually(predicate: Callable[[], bool], *, timeout: float, what: str) -> float:
    """Re-check ``predicate`` until it holds; return how long it took."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - started
