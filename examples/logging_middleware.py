"""Logging with the attempt's identity on every line a handler logs.

The ``log_context`` middleware binds job id, type, chain, attempt and worker id while the
handler runs; ``LogContextFilter`` copies them onto each ``logging`` record, so a format
string (or a JSON formatter) can show them without the handler passing anything. A
middleware of your own wraps the same way: ``async def mw(attempt, call_next)``.

    PGWORK_DSN=postgresql://localhost/app python examples/logging_middleware.py
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import anyio
import psycopg
from pydantic import BaseModel

from pgwork import (
    Attempt,
    JobTypeRegistry,
    LogContextFilter,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
    log_context,
)
from pgwork.middleware import CallNext

log = logging.getLogger("app.billing")


class Invoice(BaseModel):
    invoice_id: int


registry = JobTypeRegistry()
charge = registry.job_type("charge_invoice", input=Invoice)


async def timed(attempt: Attempt[Any, Any], call_next: CallNext) -> Any:
    """A middleware of our own: time every attempt (inside log_context, so it logs ids)."""
    started = time.perf_counter()
    try:
        return await call_next(attempt)
    finally:
        log.info("took %.1f ms", (time.perf_counter() - started) * 1000)


async def charge_invoice(attempt: Attempt[Invoice, Any]) -> None:
    log.info("charging invoice %d", attempt.job.input.invoice_id)


def configure_logging() -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.addFilter(LogContextFilter())
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(name)s [job=%(job_id)s attempt=%(attempt)s] %(message)s")
    )
    logging.getLogger("app").addHandler(handler)
    logging.getLogger("app").setLevel(logging.INFO)


async def main(dsn: str) -> None:
    configure_logging()
    state = await PostgresStateAdapter.connect(dsn)
    client = create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(dsn), registry=registry
    )
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            started = await client.start_chain(conn, charge, Invoice(invoice_id=42))
            await conn.commit()
        worker = create_in_process_worker(
            client=client,
            processors={charge: charge_invoice},
            middlewares=[log_context, timed],  # first = outermost
        )
        async with worker:
            await client.await_chain(started.id, timeout=30)
        log.info("outside any attempt the fields read '-'")
    finally:
        await client.close()


if __name__ == "__main__":
    anyio.run(main, os.environ["PGWORK_DSN"])
