"""Fixtures of the signal tests: those of the engine tests (a client on a fresh
migrated database, workers stopped at the end, a caller's connection, and the wake-up
tests' 30 s-poll workers and deaf listeners)."""

from __future__ import annotations

from tests.engine.conftest import clients, conn, make_client, start_worker, workers

__all__ = ["clients", "conn", "make_client", "start_worker", "workers"]
