"""The event catalogue, the logging observer, the instrumented adapter, OpenTelemetry."""

from __future__ import annotations

import ast
import inspect
import logging
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from pydantic import BaseModel
from tests._core_only import CoreOnly

import pgwork.observability._events as catalogue
from pgwork import (
    Attempt,
    Continue,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    StateAdapter,
    create_client,
    create_in_process_worker,
)
from pgwork.adapters.capabilities import CAPABILITY_PROTOCOLS, Capabilities, operations
from pgwork.adapters.state import CoreStateAdapter, DueTimes, OperatorViews, SyncAdopter
from pgwork.observability import (
    ADAPTER_CALL_ERROR,
    ADAPTER_CALL_START,
    ADAPTER_CALL_STOP,
    ATTEMPT_COMPLETED,
    EVENT_NAMES,
    Event,
    InstrumentedStateAdapter,
    LoggingObserver,
    Observer,
    OpenTelemetryObserver,
)
from pgwork.observability.emitter import Emitter
from pgwork.postgres.stats import queue_depths

ROOT = Path(__file__).resolve().parents[2]


class Num(BaseModel):
    n: int


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def on_event(self, event: Event) -> None:
        self.events.append(event)


# --- the catalogue -------------------------------------------------------------------


def _catalogue_constants() -> dict[str, str | None]:
    """Each upper-case string constant of the catalogue and the docstring under it."""
    tree = ast.parse(inspect.getsource(catalogue))
    found: dict[str, str | None] = {}
    body = tree.body
    for node, following in zip(body, [*body[1:], None], strict=True):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id.isupper()
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            doc = None
            if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
                doc = str(following.value.value)
            found[node.value.value] = doc
    return found


def test_every_event_name_is_a_documented_constant_in_the_catalogue() -> None:
    constants = _catalogue_constants()

    assert set(constants) == set(EVENT_NAMES)
    assert {name for name, doc in constants.items() if not doc} == set()
    assert {
        "job.enqueued",
        "attempt.started",
        "attempt.completed",
        "attempt.failed",
        "attempt.retried",
        "attempt.aborted",
        "attempt.abandoned",
        "handler.ended_late",
        "job.reaped",
        "lease.lost",
        "worker.started",
        "worker.stopped",
        "listener.reconnected",
        "adapter.call.start",
        "adapter.call.stop",
        "adapter.call.error",
        "dashboard.action",
        "dashboard.auth_failed",
    } == set(EVENT_NAMES)


def test_docs_list_every_event() -> None:
    page = (ROOT / "docs" / "observability.md").read_text()

    assert [name for name in sorted(EVENT_NAMES) if f"`{name}`" not in page] == []


# --- the logging observer ------------------------------------------------------------


def test_logging_observer_levels_and_fields(caplog: pytest.LogCaptureFixture) -> None:
    from datetime import UTC, datetime

    observer = LoggingObserver()
    assert isinstance(observer, Observer)
    now = datetime.now(UTC)
    with caplog.at_level(logging.DEBUG, logger="pgwork.events"):
        observer.on_event(
            Event("attempt.failed", now, {"job_id": "j1", "name": "clash", "duration_s": 0.5})
        )
        observer.on_event(
            Event("attempt.aborted", now, {"reason": "worker_stopping", "released": True})
        )
        observer.on_event(Event("attempt.aborted", now, {"reason": "timeout", "released": False}))

    failed, released, timed_out = caplog.records
    assert failed.levelno == logging.ERROR
    assert failed.job_id == "j1"  # type: ignore[attr-defined]
    assert failed.pgwork_name == "clash"  # type: ignore[attr-defined]
    assert failed.getMessage() == "pgwork attempt.failed job_id=j1 name=clash duration_s=0.500"
    assert released.levelno == logging.INFO
    assert timed_out.levelno == logging.WARNING


def test_logging_observer_skips_disabled_levels(caplog: pytest.LogCaptureFixture) -> None:
    from datetime import UTC, datetime

    with caplog.at_level(logging.INFO, logger="pgwork.events"):
        LoggingObserver().on_event(Event("attempt.started", datetime.now(UTC), {}))

    assert caplog.records == []


# --- the instrumented adapter --------------------------------------------------------


def test_instrumented_adapter_wraps_every_protocol_operation() -> None:
    own = {name for name in vars(InstrumentedStateAdapter) if not name.startswith("_")}

    # control: the roles' operations are found at all (an empty set would pass below)
    assert {"acquire", "insert_jobs", "list_jobs", "cancel_chains", "heartbeat"} <= (
        operations(StateAdapter)
    )
    assert operations(StateAdapter) - own == set()


@pytest.mark.anyio
async def test_instrumented_adapter_reports_each_call(pgwork_dsn: str) -> None:
    recorder = Recorder()
    inner = await PostgresStateAdapter.connect(pgwork_dsn)
    adapter = InstrumentedStateAdapter(inner, observers=[recorder])
    assert isinstance(adapter, StateAdapter)
    try:
        await adapter.get_jobs(None, job_ids=[])
        with pytest.raises(psycopg.Error):
            await _divide_by_zero_in_a_transaction(adapter)
    finally:
        await adapter.close()

    seen = [(e.name, e["operation"]) for e in recorder.events]
    assert seen == [
        (ADAPTER_CALL_START, "get_jobs"),
        (ADAPTER_CALL_STOP, "get_jobs"),
        (ADAPTER_CALL_START, "transaction"),
        (ADAPTER_CALL_ERROR, "transaction"),
        (ADAPTER_CALL_START, "close"),
        (ADAPTER_CALL_STOP, "close"),
    ]
    error = recorder.events[3]
    assert error["error_type"] == "DivisionByZero"
    assert error["duration_s"] >= 0


def _core_with(*offered: type) -> Any:
    """A view of the PostgreSQL adapter with the core and the capabilities ``offered``."""

    def view(adapter: PostgresStateAdapter) -> Any:
        store = CoreOnly(adapter)
        for name in {name for protocol in offered for name in operations(protocol)}:
            setattr(store, name, getattr(adapter, name))
        return store

    return view


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("store", "lacks"),
    [
        (CoreOnly, [p.__name__ for p in CAPABILITY_PROTOCOLS]),
        (
            _core_with(DueTimes, OperatorViews),
            [p.__name__ for p in CAPABILITY_PROTOCOLS if p not in (DueTimes, OperatorViews)],
        ),
        (lambda adapter: adapter, []),
    ],
    ids=["core only", "core, due times and views", "PostgreSQL"],
)
async def test_instrumented_adapter_offers_the_capabilities_of_the_store_it_wraps(
    pgwork_dsn: str, store: Any, lacks: list[str]
) -> None:
    adapter = await PostgresStateAdapter.connect(pgwork_dsn)
    try:
        inner = store(adapter)
        instrumented = InstrumentedStateAdapter(inner, observers=[])

        # control: the store lacks what the case says (the views are what they claim)
        assert list(Capabilities.of(inner).missing) == lacks
        assert list(Capabilities.of(instrumented).missing) == lacks
        assert isinstance(instrumented, CoreStateAdapter)
        assert isinstance(instrumented, SyncAdopter) == isinstance(inner, SyncAdopter)
    finally:
        await adapter.close()


async def _divide_by_zero_in_a_transaction(adapter: InstrumentedStateAdapter) -> None:
    async with adapter.transaction() as tx:
        conn: Any = tx.connection  # type: ignore[attr-defined]
        await conn.execute("SELECT 1/0")


# --- OpenTelemetry -------------------------------------------------------------------


def _metrics(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = list(metric.data.data_points)
    return found


@pytest.mark.anyio
async def test_otel_traces_enqueue_and_attempts_in_one_trace_with_metrics(
    pgwork_dsn: str,
) -> None:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    observer = OpenTelemetryObserver(
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
        queue_depth=lambda: queue_depths(pgwork_dsn),
    )
    reg = JobTypeRegistry()
    first = reg.job_type("first", input=Num, continue_with=["second"])
    second = reg.job_type("second", input=Num, output=Num, entry=False)
    inner_span_parent: list[Any] = []

    async def handle_first(attempt: Attempt[Num, Any]) -> Continue[Num]:
        return Continue(second, Num(n=attempt.job.input.n + 1))

    async def handle_second(attempt: Attempt[Num, Num]) -> Num:
        # A span the handler opens nests under the attempt's span.
        with tracer_provider.get_tracer("app").start_as_current_span("handler work") as span:
            inner_span_parent.append(span.parent)
        return attempt.job.input

    both_done = anyio.Event()

    class Recorder:
        completed = 0

        def on_event(self, event: Event) -> None:
            if event.name == ATTEMPT_COMPLETED:
                self.completed += 1
                if self.completed == 2:
                    both_done.set()

    recorder = Recorder()
    state = await PostgresStateAdapter.connect(pgwork_dsn)
    client = create_client(
        state_adapter=state,
        notify_adapter=PostgresNotifyAdapter(pgwork_dsn),
        registry=reg,
        observers=[observer, recorder],
    )
    try:
        app = tracer_provider.get_tracer("app")
        async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
            with app.start_as_current_span("POST /signup"):
                await client.start_chain(conn, first, Num(n=1))
            await conn.commit()
        assert _metrics(reader)["pgwork.queue.depth"][0].value == 1
        worker = create_in_process_worker(
            client=client, processors={first: handle_first, second: handle_second}
        )
        async with worker:
            with anyio.fail_after(20):
                await both_done.wait()
    finally:
        await client.close()

    by_name = {s.name: s for s in spans.get_finished_spans()}
    request = by_name["POST /signup"]
    enqueue = by_name["pgwork enqueue first"]
    process_first = by_name["pgwork process first"]
    process_second = by_name["pgwork process second"]
    assert enqueue.kind is SpanKind.PRODUCER
    assert enqueue.parent is not None
    assert enqueue.parent.span_id == request.context.span_id
    for process in (process_first, process_second):
        assert process.kind is SpanKind.CONSUMER
        assert process.context.trace_id == request.context.trace_id
        assert process.parent is not None
        assert process.parent.span_id == enqueue.context.span_id
    assert process_first.attributes is not None
    assert process_first.attributes["pgwork.outcome"] == "continued"
    assert inner_span_parent[0].span_id == process_second.context.span_id

    metrics = _metrics(reader)
    processed = {dp.attributes["outcome"]: dp.value for dp in metrics["pgwork.jobs.processed"]}
    assert processed == {"continued": 1, "completed": 1}
    assert metrics["pgwork.jobs.enqueued"][0].value == 1
    assert sum(dp.count for dp in metrics["pgwork.attempt.duration"]) == 2
    assert all(dp.value == 0 for dp in metrics["pgwork.worker.active_slots"])
    # Drained, the queue's gauge reads 0 rather than vanishing.
    depth = {dp.attributes["queue"]: dp.value for dp in metrics["pgwork.queue.depth"]}
    assert depth == {"default": 0}


def test_enqueue_tracing_without_a_tracer_is_one_shared_no_op() -> None:
    """``start_chain`` enters ``trace_enqueue`` on every call; without a tracer it must
    not build a generator context each time (and must still yield no carrier)."""
    emitter = Emitter([LoggingObserver()])
    first = emitter.trace_enqueue(["a"])
    assert emitter.trace_enqueue(["b"]) is first
    with first as carrier:
        assert carrier is None
    with pytest.raises(ValueError, match="through"), emitter.trace_enqueue(["c"]):
        raise ValueError("passes through")
