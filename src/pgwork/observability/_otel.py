"""OpenTelemetry traces and metrics from pgwork's events (``pip install 'pgwork[otel]'``).

Traces: ``start_chain(s)`` runs inside a PRODUCER span ``pgwork enqueue <type>`` whose
context is stored in each new job's row; each attempt is a CONSUMER span ``pgwork process
<type>`` whose parent is that stored context, so a request, its enqueue and every attempt
of every job of the chain land in one trace. The attempt span is the current span while
the handler runs, so spans the handler opens (HTTP calls, queries) nest under it.

Metrics: ``pgwork.jobs.enqueued`` and ``pgwork.jobs.processed`` (counters, by job type,
queue and outcome), ``pgwork.attempt.duration`` (histogram, seconds),
``pgwork.worker.active_slots`` (up-down counter) and, when given a ``queue_depth``
callable, ``pgwork.queue.depth`` (observable gauge of pending jobs per queue); when
given a ``flow_usage`` callable, ``pgwork.flow.running`` and ``pgwork.flow.limit``
(observable gauges per limited job type: attempts running on every worker, and the
effective concurrency limit); when given a ``flow_rates`` callable,
``pgwork.flow.started`` and ``pgwork.flow.rate`` (per job type with a rate: attempts
started in the rate's current window, and how many it lets start per window).

OpenTelemetry is imported when the observer is created, never by ``import pgwork``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pgwork.observability._events import (
    ATTEMPT_ABANDONED,
    ATTEMPT_ABORTED,
    ATTEMPT_COMPLETED,
    ATTEMPT_FAILED,
    ATTEMPT_RETRIED,
    ATTEMPT_STARTED,
    HANDLER_ENDED_LATE,
    JOB_ENQUEUED,
    LEASE_LOST,
    WORKER_STOPPED,
    Event,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
    from opentelemetry.trace import Span, TracerProvider

__all__ = ["OpenTelemetryObserver"]

log = logging.getLogger("pgwork.observability")

SYSTEM = "pgwork"
# Seconds: jobs take milliseconds to minutes (the SDK default buckets suit milliseconds).
DURATION_BUCKETS = [
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
]

_SETTLED = {
    ATTEMPT_COMPLETED: "completed",
    ATTEMPT_FAILED: "failed",
    ATTEMPT_RETRIED: "retried",
    ATTEMPT_ABORTED: "aborted",
    LEASE_LOST: "lease_lost",
}


class _Running:
    __slots__ = ("span", "token", "worker_id")

    def __init__(self, span: Span, token: object, worker_id: str) -> None:
        self.span = span
        self.token = token
        self.worker_id = worker_id


class OpenTelemetryObserver:
    """Turn pgwork's events into OpenTelemetry spans and metrics.

    ``tracer_provider`` / ``meter_provider``: default to the global ones.
    ``queue_depth``: a callable returning ``{queue: pending jobs}`` (e.g.
    ``functools.partial(pgwork.postgres.stats.queue_depths, dsn)``), called from the
    metric reader's thread at each collection. ``flow_usage``: a callable returning
    ``{job type: (running, concurrency limit or None)}`` (e.g.
    ``functools.partial(pgwork.postgres.stats.flow_usage, dsn, registry)``), read the
    same way; a type without a concurrency limit reports no limit. ``flow_rates``: a
    callable returning ``{job type: (started in the rate's window, rate count)}`` for
    the types with a rate (e.g. ``functools.partial(pgwork.postgres.stats.flow_rates,
    dsn, registry)``), read the same way.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        queue_depth: Callable[[], Mapping[str, int]] | None = None,
        flow_usage: Callable[[], Mapping[str, tuple[int, int | None]]] | None = None,
        flow_rates: Callable[[], Mapping[str, tuple[int, int]]] | None = None,
    ) -> None:
        from opentelemetry import metrics, trace

        self._tracer = trace.get_tracer("pgwork", tracer_provider=tracer_provider)
        meter = metrics.get_meter("pgwork", meter_provider=meter_provider)
        self._enqueued = meter.create_counter(
            "pgwork.jobs.enqueued", unit="{job}", description="Chains started by clients."
        )
        self._processed = meter.create_counter(
            "pgwork.jobs.processed",
            unit="{attempt}",
            description="Attempts settled by workers, by outcome.",
        )
        self._duration = meter.create_histogram(
            "pgwork.attempt.duration",
            unit="s",
            description="Attempt duration, handler to write.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._active = meter.create_up_down_counter(
            "pgwork.worker.active_slots", unit="{slot}", description="Attempts running now."
        )
        self._abandoned = meter.create_up_down_counter(
            "pgwork.worker.abandoned_handlers",
            unit="{handler}",
            description="Handlers given up on (they ignored cancellation) that still run.",
        )
        self._queue_depth = queue_depth
        self._queues_seen: set[str] = set()
        if queue_depth is not None:
            meter.create_observable_gauge(
                "pgwork.queue.depth",
                callbacks=[self._observe_queue_depth],
                unit="{job}",
                description="Pending jobs per queue.",
            )
        self._flow_usage = flow_usage
        self._types_seen: set[str] = set()
        if flow_usage is not None:
            meter.create_observable_gauge(
                "pgwork.flow.running",
                callbacks=[self._observe_flow_running],
                unit="{attempt}",
                description="Attempts of a limited job type running on every worker.",
            )
            meter.create_observable_gauge(
                "pgwork.flow.limit",
                callbacks=[self._observe_flow_limit],
                unit="{attempt}",
                description="A limited job type's effective concurrency limit.",
            )
        self._flow_rates = flow_rates
        if flow_rates is not None:
            meter.create_observable_gauge(
                "pgwork.flow.started",
                callbacks=[self._observe_flow_started],
                unit="{attempt}",
                description="Attempts of a rated job type started in its rate's current window.",
            )
            meter.create_observable_gauge(
                "pgwork.flow.rate",
                callbacks=[self._observe_flow_rate],
                unit="{attempt}",
                description="How many attempts a job type's effective rate lets start per window.",
            )
        self._running: dict[tuple[Any, Any], _Running] = {}

    # --- enqueue -----------------------------------------------------------------------

    @contextmanager
    def trace_enqueue(self, job_types: Sequence[str]) -> Iterator[Mapping[str, str] | None]:
        from opentelemetry import propagate, trace

        names = sorted(set(job_types))
        span_name = f"pgwork enqueue {names[0]}" if len(names) == 1 else "pgwork enqueue"
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.batch.message_count": len(job_types),
            "pgwork.job_types": names,
        }
        # OpenTelemetry's own exception recording would store the message and the
        # chained traceback, and a validation error's chain quotes the input: a secret in
        # a payload would end up in every trace backend. Record the error's type only.
        with self._tracer.start_as_current_span(
            span_name,
            kind=trace.SpanKind.PRODUCER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            try:
                yield carrier or None
            except BaseException as exc:
                _record_error(span, exc)
                raise

    # --- events ------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        if event.name == ATTEMPT_STARTED:
            self._start_attempt(event)
        elif event.name in _SETTLED:
            self._end_attempt(event)
        elif event.name == JOB_ENQUEUED and not event.fields.get("deduplicated"):
            self._enqueued.add(1, {"job_type": event["job_type"], "queue": event["queue"]})
        elif event.name == ATTEMPT_ABANDONED:
            self._abandoned.add(1, {"worker_id": event["worker_id"]})
        elif event.name == HANDLER_ENDED_LATE:
            self._abandoned.add(-1, {"worker_id": event["worker_id"]})
        elif event.name == WORKER_STOPPED:
            self._abandon(event["worker_id"])

    def _start_attempt(self, event: Event) -> None:
        from opentelemetry import context, propagate, trace

        fields = event.fields
        parent = propagate.extract(dict(fields.get("trace_context") or {}), context.Context())
        span = self._tracer.start_span(
            f"pgwork process {fields['job_type']}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.destination.name": fields["queue"],
                "messaging.message.id": str(fields["job_id"]),
                "pgwork.job_type": fields["job_type"],
                "pgwork.chain_id": str(fields["chain_id"]),
                "pgwork.attempt": fields["attempt"],
                "pgwork.worker_id": fields["worker_id"],
                "pgwork.mode": fields.get("mode") or "",
            },
        )
        # Current for the rest of the slot's task: the handler's own spans nest under it.
        token = context.attach(trace.set_span_in_context(span))
        key = (fields["job_id"], fields["lease_token"])
        self._running[key] = _Running(span, token, fields["worker_id"])
        self._active.add(1, {"job_type": fields["job_type"], "queue": fields["queue"]})

    def _end_attempt(self, event: Event) -> None:
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        fields = event.fields
        running = self._running.pop((fields.get("job_id"), fields.get("lease_token")), None)
        if running is None and event.name == LEASE_LOST:
            return  # the attempt's own settlement event was reported already
        outcome = _SETTLED[event.name]
        if event.name == ATTEMPT_COMPLETED:
            outcome = fields.get("outcome") or outcome
        labels = {"job_type": fields["job_type"], "queue": fields["queue"], "outcome": outcome}
        self._processed.add(1, labels)
        if fields.get("duration_s") is not None:
            self._duration.record(fields["duration_s"], labels)
        if running is None:
            return
        self._active.add(-1, {"job_type": fields["job_type"], "queue": fields["queue"]})
        span = running.span
        span.set_attribute("pgwork.outcome", outcome)
        if event.name in (ATTEMPT_FAILED, ATTEMPT_RETRIED):
            span.set_attribute("error.type", str(fields.get("error_type")))
            span.set_status(Status(StatusCode.ERROR, str(fields.get("error_message"))))
        elif event.name == LEASE_LOST:
            span.set_status(Status(StatusCode.ERROR, "lease lost"))
        elif event.name == ATTEMPT_ABORTED:
            span.set_attribute("pgwork.abort_reason", str(fields.get("reason")))
        span.end()
        # OpenTelemetry logs (does not raise) if settled from another context.
        context.detach(running.token)  # type: ignore[arg-type]

    def _abandon(self, worker_id: str) -> None:
        """End spans of a stopped worker whose attempts never reported a settlement."""
        for key, running in list(self._running.items()):
            if running.worker_id == worker_id:
                del self._running[key]
                running.span.set_attribute("pgwork.outcome", "abandoned")
                running.span.end()

    def _observe_queue_depth(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        assert self._queue_depth is not None
        try:
            depths = self._queue_depth()
        except Exception as exc:
            log.warning("pgwork queue depth could not be read: %s", exc)
            return []
        # A queue that drained drops out of the callback's answer; a gauge that stops
        # reporting reads as "no data", not as zero, so each queue seen once stays at 0.
        for queue in depths:
            self._queues_seen.add(queue)
        return [
            Observation(depths.get(queue, 0), {"queue": queue})
            for queue in sorted(self._queues_seen)
        ]

    def _read_flow(self) -> Mapping[str, tuple[int, int | None]]:
        assert self._flow_usage is not None
        try:
            found = self._flow_usage()
        except Exception as exc:
            log.warning("pgwork flow usage could not be read: %s", exc)
            return {}
        self._types_seen.update(found)
        return found

    def _observe_flow_running(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        found = self._read_flow()
        if not found:
            return []
        # As for queues: a type seen once reports 0 rather than dropping out.
        return [
            Observation(found.get(name, (0, None))[0], {"job_type": name})
            for name in sorted(self._types_seen)
        ]

    def _observe_flow_limit(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        return [
            Observation(limit, {"job_type": name})
            for name, (_, limit) in sorted(self._read_flow().items())
            if limit is not None
        ]

    def _read_rates(self) -> Mapping[str, tuple[int, int]]:
        assert self._flow_rates is not None
        try:
            return self._flow_rates()
        except Exception as exc:
            log.warning("pgwork flow rates could not be read: %s", exc)
            return {}

    def _observe_flow_started(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        # A type whose rate is lifted drops out: with no window, it has no count.
        return [
            Observation(started, {"job_type": name})
            for name, (started, _) in sorted(self._read_rates().items())
        ]

    def _observe_flow_rate(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        return [
            Observation(rate, {"job_type": name})
            for name, (_, rate) in sorted(self._read_rates().items())
        ]

    def __repr__(self) -> str:
        return "OpenTelemetryObserver()"


def _record_error(span: Span, exc: BaseException) -> None:
    """Mark ``span`` failed by ``exc``'s type, without its message or traceback (which
    may quote payload values)."""
    from opentelemetry.trace import Status, StatusCode

    error_type = f"{type(exc).__module__}.{type(exc).__qualname__}"
    span.set_attribute("error.type", error_type)
    span.add_event("exception", {"exception.type": error_type})
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
