"""Payload values never reach spans, span events, logs or stored errors by default.

A secret in a job's input (a token, a password) must stay in the job row: validation
errors name the path and the rule, not the value.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from pydantic import BaseModel

from pgwork import (
    JobTypeRegistry,
    PayloadValidationError,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)
from pgwork.observability import ATTEMPT_FAILED, Event, LoggingObserver, OpenTelemetryObserver

pytestmark = pytest.mark.anyio

SECRET = "hunter2-very-secret"


class Login(BaseModel):
    user: str
    pin: int


def _span_text(exporter: InMemorySpanExporter) -> str:
    """Everything the exported spans carry, as one string to search."""
    parts: list[str] = []
    for span in exporter.get_finished_spans():
        parts.append(repr(dict(span.attributes or {})))
        parts.append(str(span.status.description))
        parts.extend(repr(dict(e.attributes or {})) for e in span.events)
    return "\n".join(parts)


async def test_a_failed_validation_keeps_the_input_out_of_spans_logs_and_errors(
    pgwork_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reg = JobTypeRegistry()
    login = reg.job_type("login", input=Login, max_attempts=1)
    failed = anyio.Event()

    class Failed:
        def on_event(self, event: Event) -> None:
            if event.name == ATTEMPT_FAILED:
                failed.set()

    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(pgwork_dsn),
        notify_adapter=PostgresNotifyAdapter(pgwork_dsn),
        registry=reg,
        observers=[OpenTelemetryObserver(tracer_provider=tracer_provider), LoggingObserver()],
    )
    try:
        async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
            # Enqueue: pydantic's own message would quote the value of ``pin``.
            with pytest.raises(PayloadValidationError) as caught:
                await client.start_chain(conn, login, {"user": "ann", "pin": SECRET})
            assert "$.pin" in str(caught.value)
            # Worker: a stored input that no longer fits the model fails to decode.
            started = await client.start_chain(conn, login, Login(user="ann", pin=1))
            await conn.execute(
                "UPDATE pgwork.jobs SET input = jsonb_set(input, '{pin}', to_jsonb(%s::text))"
                " WHERE id = %s",
                (SECRET, started.job_id),
            )
            await conn.commit()

        async def never_called(attempt: Any) -> None:
            raise AssertionError("the stored input must fail to decode first")

        worker = create_in_process_worker(
            client=client, processors={login: never_called}, observers=[Failed()]
        )
        async with worker:
            with anyio.fail_after(20):
                await failed.wait()
        async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
            cur = await conn.execute(
                "SELECT last_attempt_error FROM pgwork.jobs WHERE id = %s", (started.job_id,)
            )
            row = await cur.fetchone()
    finally:
        await client.close()

    [enqueue] = [s for s in spans.get_finished_spans() if s.name == "pgwork enqueue login"][:1]
    assert SECRET not in _span_text(spans)
    assert enqueue.status.status_code is StatusCode.ERROR
    assert (enqueue.attributes or {})["error.type"].endswith("PayloadValidationError")
    assert SECRET not in caplog.text
    assert row is not None
    stored_error: dict[str, Any] = row[0]
    assert "stored input of job type 'login' does not match" in stored_error["message"]
    assert SECRET not in repr(stored_error)  # message and traceback
