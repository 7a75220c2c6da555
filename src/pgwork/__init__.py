"""pgwork: durable background jobs and typed job chains in the PostgreSQL you already have.

This module only re-exports the public API; see the README for a tour.
"""

from pgwork.adapters.in_process import InProcessNotifyAdapter
from pgwork.adapters.notify import Listener, Notice, NotifyAdapter
from pgwork.adapters.state import BlockedJob, BlockerStatus, DedupSpec, QueueCount, StateAdapter
from pgwork.backoff import RetryPolicy, backoff_delay
from pgwork.client import ChainStart, Client, StartedChain, create_client
from pgwork.errors import (
    AttemptAlreadyFinishedError,
    ChainHasDependantsError,
    ChainNotFoundError,
    ConfigurationError,
    ContinuationNotAllowedError,
    DatabaseError,
    DatabaseUnreachableError,
    DuplicateJobTypeError,
    HandlerAbandonedError,
    InvalidCursorError,
    InvalidOptionError,
    InvalidSchemaNameError,
    JobError,
    JobNotFoundError,
    JobTypeError,
    LeaseLostError,
    NotAnEntryTypeError,
    PayloadError,
    PayloadNotSerializableError,
    PayloadTooDeepError,
    PayloadTooLargeError,
    PayloadValidationError,
    PgworkError,
    SchemaMissingError,
    SchemaOutdatedError,
    UnknownJobTypeError,
    UnsupportedConnectionError,
    WorkerError,
    WorkerStateError,
)
from pgwork.job_types import Continue, JobType, JobTypeRegistry, ProcessingMode
from pgwork.middleware import LogContextFilter, Middleware, compose, log_context
from pgwork.postgres.notify import PostgresNotifyAdapter
from pgwork.postgres.state import PostgresStateAdapter
from pgwork.records import AbortReason, AttemptError, Chain, ChainStatus, Job, JobStatus, Page
from pgwork.worker import Attempt, Handler, InProcessWorker, create_in_process_worker

__version__ = "0.1.0"

__all__ = [
    "AbortReason",
    "Attempt",
    "AttemptAlreadyFinishedError",
    "AttemptError",
    "BlockedJob",
    "BlockerStatus",
    "Chain",
    "ChainHasDependantsError",
    "ChainNotFoundError",
    "ChainStart",
    "ChainStatus",
    "Client",
    "ConfigurationError",
    "ContinuationNotAllowedError",
    "Continue",
    "DatabaseError",
    "DatabaseUnreachableError",
    "DedupSpec",
    "DuplicateJobTypeError",
    "Handler",
    "HandlerAbandonedError",
    "InProcessNotifyAdapter",
    "InProcessWorker",
    "InvalidCursorError",
    "InvalidOptionError",
    "InvalidSchemaNameError",
    "Job",
    "JobError",
    "JobNotFoundError",
    "JobStatus",
    "JobType",
    "JobTypeError",
    "JobTypeRegistry",
    "LeaseLostError",
    "Listener",
    "LogContextFilter",
    "Middleware",
    "NotAnEntryTypeError",
    "Notice",
    "NotifyAdapter",
    "Page",
    "PayloadError",
    "PayloadNotSerializableError",
    "PayloadTooDeepError",
    "PayloadTooLargeError",
    "PayloadValidationError",
    "PgworkError",
    "PostgresNotifyAdapter",
    "PostgresStateAdapter",
    "ProcessingMode",
    "QueueCount",
    "RetryPolicy",
    "SchemaMissingError",
    "SchemaOutdatedError",
    "StartedChain",
    "StateAdapter",
    "UnknownJobTypeError",
    "UnsupportedConnectionError",
    "WorkerError",
    "WorkerStateError",
    "__version__",
    "backoff_delay",
    "compose",
    "create_client",
    "create_in_process_worker",
    "log_context",
]
