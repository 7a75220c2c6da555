"""OpenTelemetry: one trace from a request through its enqueue to every attempt, plus
metrics, printed by the console exporters (``pip install 'pgwork[otel]'``).

Swap the console exporters for OTLP ones to send the same data to a collector.

    PGWORK_DSN=postgresql://localhost/app python examples/opentelemetry_example.py
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import anyio
import psycopg
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from pydantic import BaseModel

from pgwork import (
    Attempt,
    Continue,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)
from pgwork.observability import LoggingObserver, OpenTelemetryObserver
from pgwork.postgres.stats import queue_depths


class Order(BaseModel):
    order_id: int


registry = JobTypeRegistry()
reserve = registry.job_type("reserve_stock", input=Order, continue_with=["ship_order"])
ship = registry.job_type("ship_order", input=Order, output=Order, entry=False)


async def reserve_stock(attempt: Attempt[Order, Any]) -> Continue[Order]:
    # Spans opened in a handler nest under the attempt's span.
    with trace.get_tracer("shop").start_as_current_span("check inventory"):
        await anyio.sleep(0.01)
    return Continue(ship, attempt.job.input)


async def ship_order(attempt: Attempt[Order, Order]) -> Order:
    return attempt.job.input


def setup_telemetry() -> tuple[TracerProvider, MeterProvider, PeriodicExportingMetricReader]:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    reader = PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=60_000)
    return tracer_provider, MeterProvider(metric_readers=[reader]), reader


async def main(dsn: str) -> None:
    tracer_provider, meter_provider, reader = setup_telemetry()
    observer = OpenTelemetryObserver(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        # Called from the metric reader's thread at each export: pending jobs per queue.
        queue_depth=partial(queue_depths, dsn),
    )
    state = await PostgresStateAdapter.connect(dsn)
    client = create_client(
        state_adapter=state,
        notify_adapter=PostgresNotifyAdapter(dsn),
        registry=registry,
        observers=[LoggingObserver(), observer],  # keep the logs, add telemetry
    )
    try:
        tracer = tracer_provider.get_tracer("shop")
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            with tracer.start_as_current_span("POST /orders"):
                started = await client.start_chain(conn, reserve, Order(order_id=7))
            await conn.commit()
        worker = create_in_process_worker(
            client=client, processors={reserve: reserve_stock, ship: ship_order}
        )
        async with worker:
            await client.await_chain(started.id, timeout=30)
    finally:
        await client.close()
    reader.force_flush()  # print the metrics now instead of at the next interval
    meter_provider.shutdown()
    tracer_provider.shutdown()


if __name__ == "__main__":
    anyio.run(main, os.environ["PGWORK_DSN"])
