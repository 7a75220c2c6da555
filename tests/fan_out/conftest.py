"""Fixtures of the fan-out tests: those of the engine tests (a client on a fresh
migrated database, workers stopped at the end, a caller's connection)."""

from __future__ import annotations

from tests.engine.conftest import conn, make_client, workers

__all__ = ["conn", "make_client", "workers"]
