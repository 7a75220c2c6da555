"""Prometheus: pgwork's OpenTelemetry metrics in the Prometheus text format
(``pip install 'pgwork[prometheus]'``).

OpenTelemetry's Prometheus reader registers with ``prometheus_client``; serve them with
``prometheus_client.start_http_server(9464)`` for Prometheus to scrape. Here the
exposition text is printed once instead.

    PGWORK_DSN=postgresql://localhost/app python examples/prometheus_metrics.py
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import anyio
import psycopg
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import REGISTRY, generate_latest
from pydantic import BaseModel

from pgwork import (
    Attempt,
    ChainStart,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)
from pgwork.observability import OpenTelemetryObserver
from pgwork.postgres.stats import queue_depths


class Ping(BaseModel):
    n: int


registry = JobTypeRegistry()
ping = registry.job_type("ping", input=Ping)


async def handle_ping(attempt: Attempt[Ping, Any]) -> None:
    pass


async def main(dsn: str) -> None:
    meter_provider = MeterProvider(metric_readers=[PrometheusMetricReader()])
    observer = OpenTelemetryObserver(
        meter_provider=meter_provider, queue_depth=partial(queue_depths, dsn)
    )
    state = await PostgresStateAdapter.connect(dsn)
    client = create_client(
        state_adapter=state,
        notify_adapter=PostgresNotifyAdapter(dsn),
        registry=registry,
        observers=[observer],
    )
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            started = await client.start_chains(
                conn, [ChainStart(ping, Ping(n=n)) for n in range(5)]
            )
            await conn.commit()
        async with create_in_process_worker(client=client, processors={ping: handle_ping}):
            for chain in started:
                await client.await_chain(chain.id, timeout=30)
    finally:
        await client.close()
    text = generate_latest(REGISTRY).decode()
    print("\n".join(line for line in text.splitlines() if "pgwork" in line))
    meter_provider.shutdown()


if __name__ == "__main__":
    anyio.run(main, os.environ["PGWORK_DSN"])
