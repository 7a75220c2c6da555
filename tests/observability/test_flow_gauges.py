"""``pgwork.flow.running`` and ``pgwork.flow.limit``: per limited job type, what runs on
every worker against its effective concurrency limit; ``pgwork.flow.started`` and
``pgwork.flow.rate``: per type with a rate, the attempts started in its window against
how many it lets start. Read from the database at each metric collection
(``pgwork.postgres.stats.flow_usage``, ``flow_rates``).

Control of the rate's use: with a keyed type's starts counted in the group of its jobs
without a key only (as a type limited as a whole records them), the rate test reads 0
started."""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

import anyio
import psycopg
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from pydantic import BaseModel

from pgwork import (
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    Rate,
    create_client,
    create_in_process_worker,
)
from pgwork.observability import OpenTelemetryObserver
from pgwork.postgres.stats import flow_rates, flow_usage

pytestmark = pytest.mark.anyio


class Item(BaseModel):
    n: int


def _gauges(reader: InMemoryMetricReader) -> dict[str, dict[str, Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: {dp.attributes["job_type"]: dp.value for dp in metric.data.data_points}
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name.startswith("pgwork.flow.")
    }


async def test_running_and_effective_limit_per_limited_type(pgwork_dsn: str) -> None:
    """Two of ``call`` run at its limit of two; an override to five shows at the next
    collection. ``plain`` declares no limit and reports nothing."""
    reg = JobTypeRegistry()
    call = reg.job_type("call", input=Item, concurrency=2)
    plain = reg.job_type("plain", input=Item)
    reader = InMemoryMetricReader()
    observer = OpenTelemetryObserver(
        meter_provider=MeterProvider(metric_readers=[reader]),
        flow_usage=partial(flow_usage, pgwork_dsn, reg),
    )
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(pgwork_dsn),
        notify_adapter=PostgresNotifyAdapter(pgwork_dsn),
        registry=reg,
        observers=[observer],
    )
    release = anyio.Event()

    async def hold(attempt: Any) -> None:
        await release.wait()

    worker = create_in_process_worker(
        client=client, processors={call: hold, plain: hold}, max_slots=5
    )
    try:
        async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
            for n in range(4):
                await client.start_chain(conn, call, Item(n=n))
            await conn.commit()
        await worker.start()
        with anyio.fail_after(20):
            # A database read at each collection: polled, as nothing announces it.
            while True:
                if _gauges(reader).get("pgwork.flow.running", {}).get("call") == 2:
                    break
                await anyio.sleep(0.05)
        assert _gauges(reader)["pgwork.flow.limit"] == {"call": 2}
        await client.set_limits(call, concurrency=5)
        gauges = _gauges(reader)
        assert gauges["pgwork.flow.limit"] == {"call": 5}
        assert set(gauges["pgwork.flow.running"]) == {"call"}
    finally:
        release.set()
        await worker.stop()
        await client.close()


async def test_started_and_effective_rate_per_rated_type(pgwork_dsn: str) -> None:
    """Three attempts of ``fetch`` ran, two of key ``a`` and one of ``b``: all three
    count against its ten an hour. An override of its rate shows at the next
    collection, its window counting the same starts. ``call`` has no rate and reports
    nothing; the concurrency gauges go on beside."""
    reg = JobTypeRegistry()
    fetch = reg.job_type(
        "fetch",
        input=Item,
        rate=Rate(10, per=timedelta(hours=1)),
        key_rate=Rate(2, per=timedelta(hours=1)),
    )
    reg.job_type("call", input=Item, concurrency=2)
    reader = InMemoryMetricReader()
    observer = OpenTelemetryObserver(
        meter_provider=MeterProvider(metric_readers=[reader]),
        flow_usage=partial(flow_usage, pgwork_dsn, reg),
        flow_rates=partial(flow_rates, pgwork_dsn, reg),
    )
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(pgwork_dsn),
        notify_adapter=PostgresNotifyAdapter(pgwork_dsn),
        registry=reg,
        observers=[observer],
    )

    async def done(attempt: Any) -> None:
        return None

    try:
        async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
            chains = [
                await client.start_chain(conn, fetch, Item(n=n), limit_key=key)
                for n, key in enumerate(["a", "a", "b"])
            ]
            await conn.commit()
        async with create_in_process_worker(client=client, processors={fetch: done}):
            for chain in chains:
                await client.await_chain(chain.id, timeout=30)

        gauges = _gauges(reader)
        assert gauges["pgwork.flow.started"] == {"fetch": 3}
        assert gauges["pgwork.flow.rate"] == {"fetch": 10}
        assert gauges["pgwork.flow.running"] == {"call": 0, "fetch": 0}
        await client.set_limits(fetch, rate=Rate(5, per=timedelta(minutes=1)))
        gauges = _gauges(reader)
        assert gauges["pgwork.flow.rate"] == {"fetch": 5}
        assert gauges["pgwork.flow.started"] == {"fetch": 3}
    finally:
        await client.close()
