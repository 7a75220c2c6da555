"""The public surface is pinned: adding or removing a name is a deliberate change."""

from __future__ import annotations

import pgwork

EXPECTED = {
    "AbortReason",
    "Attempt",
    "AtomicSyncHandlerError",
    "AttemptAlreadyFinishedError",
    "AttemptCancelledError",
    "AttemptError",
    "BlockedJob",
    "BlockerStatus",
    "CapabilityMissingError",
    "Chain",
    "ChainHasDependantsError",
    "ChainNotFoundError",
    "ChainStart",
    "ChainStatus",
    "ChildNotStartedHereError",
    "ChildWaitNotAllowedError",
    "Children",
    "Client",
    "ConfigurationError",
    "Continue",
    "ContinuationNotAllowedError",
    "DatabaseError",
    "DatabaseTimeoutError",
    "DatabaseUnreachableError",
    "Debounce",
    "DedupSpec",
    "DuplicateJobTypeError",
    "DuplicateSignalTypeError",
    "FailedAttempt",
    "Handler",
    "HandlerAbandonedError",
    "HandlerProcessDiedError",
    "InProcessNotifyAdapter",
    "InProcessWorker",
    "InvalidCursorError",
    "InvalidOptionError",
    "InvalidSchemaNameError",
    "IsolationLevelError",
    "Job",
    "JobError",
    "JobNotFoundError",
    "JobStatus",
    "JobType",
    "JobTypeError",
    "JobTypeRegistry",
    "KeyLimitStatus",
    "LeaseLostError",
    "LimitNotDeclaredError",
    "LimitStatus",
    "Limits",
    "Listener",
    "LogContextFilter",
    "Middleware",
    "NotAnEntryTypeError",
    "NotificationsUnavailableError",
    "Notice",
    "NotifyAdapter",
    "OutcomeNotStorableError",
    "Page",
    "PayloadError",
    "PayloadNotSerializableError",
    "PayloadTooDeepError",
    "PayloadTooLargeError",
    "PayloadUndecodableError",
    "PayloadValidationError",
    "PgworkError",
    "ProcessHandlerError",
    "PostgresNotifyAdapter",
    "PostgresStateAdapter",
    "ProcessingMode",
    "QueueCount",
    "Rate",
    "RetryPolicy",
    "SchemaMissingError",
    "SchemaOutdatedError",
    "SyncAttempt",
    "SyncHandler",
    "SyncHandlerError",
    "StartedChain",
    "StateAdapter",
    "UnencodableTextError",
    "UnknownJobTypeError",
    "SignalKey",
    "SignalType",
    "SignalWait",
    "Signalled",
    "TimedOut",
    "UnknownSignalTypeError",
    "WaitNotDeclaredError",
    "WaitingJobType",
    "UnsupportedConnectionError",
    "UnsupportedServerVersionError",
    "WorkerError",
    "WorkerStateError",
    "__version__",
    "backoff_delay",
    "compose",
    "create_client",
    "create_in_process_worker",
    "log_context",
}


def test_all_is_exactly_the_documented_surface() -> None:
    assert set(pgwork.__all__) == EXPECTED


def test_every_exported_name_resolves() -> None:
    for name in pgwork.__all__:
        assert getattr(pgwork, name) is not None


def test_every_error_is_a_pgwork_error() -> None:
    errors = [getattr(pgwork, n) for n in pgwork.__all__ if n.endswith("Error")]
    for error in errors:
        if isinstance(error, type) and error is not pgwork.AttemptError:
            assert issubclass(error, pgwork.PgworkError), error
