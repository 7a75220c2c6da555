"""Skips a CI run may have, and why; any other skip fails the run under ``CI=true``.

A skip hides a feature from CI as surely as a deleted test: the database tests skip
when no server answers, the fault tier when the embedded server cannot start, the
PgBouncer and browser tests when their programs are missing. A skip at collection
(a module-level ``pytest.skip`` or ``importorskip``) counts too: it hides every test of
its file at once. Locally a skip says what
to install; in CI (``CI`` set to a true value) it must be one of these, each with the
reason it is expected, or the run fails and lists it.
"""

from __future__ import annotations

import os
import re

import pytest

__all__ = ["EXPECTED_SKIPS", "in_ci", "unexpected"]

# A pytest plugin (the root conftest.py loads it): the hooks at the end of this module.

# Regex on the skip reason -> why it is expected.
EXPECTED_SKIPS: dict[str, str] = {
    r"^PostgreSQL 18 skips through the index by itself \(skip scan\)$": (
        "the control of the sleeping steps' loose scan needs a server without B-tree "
        "skip scan; the pass on the machine's PostgreSQL 15 runs it"
    ),
    r"^one round trip needs PostgreSQL 17$": (
        "the pipelined BEGIN + lock uses PostgreSQL 17's transaction_timeout; the pass "
        "on the machine's PostgreSQL 15 checks the two-round-trip path instead"
    ),
    r"^adapter does not claim (delivers_on_commit_only|folds_identical_notices)$": (
        "the in-process, Redis and NATS notify adapters see no transactions, so they claim neither"
    ),
    r"^adapter does not claim hands_out_hints$": (
        "PostgreSQL's and the in-process notify adapters hand out no hints: every listener looks"
    ),
    r"^a Docker engine is reachable here; the failure path cannot be exercised$": (
        "the testcontainers failure path is tested only where no Docker engine runs"
    ),
    r"^needs signals$": "POSIX only; CI runs on Linux, so this never skips there",
    r"^the store does not offer [A-Za-z]+(, [A-Za-z]+)*$": (
        "tests/adapters/test_conformance_core_only.py runs the state suite on a store offering the "
        "core alone: the cases that need a capability skip there, by design, and run "
        "against the full PostgreSQL adapter in tests/adapters/test_conformance_postgres.py"
    ),
}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def unexpected(reasons: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (test, reason) pairs whose reason matches no expected skip."""
    return [
        (test, reason)
        for test, reason in reasons
        if not any(re.search(pattern, reason) for pattern in EXPECTED_SKIPS)
    ]


_SKIPPED = pytest.StashKey[list[tuple[str, str]]]()
_config: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SKIPPED] = []
    _config.append(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    _config.remove(config)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # An expected failure (xfail) is reported as skipped too; it is no skip.
    if hasattr(report, "wasxfail"):
        return
    if report.skipped and isinstance(report.longrepr, tuple) and _config:
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        _config[-1].stash[_SKIPPED].append((report.nodeid, reason))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    # A module-level skip (``pytest.skip(allow_module_level=True)``, ``importorskip``
    # at import) skips a whole file at collection: no test of it is ever reported.
    if report.skipped and isinstance(report.longrepr, tuple) and _config:
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        _config[-1].stash[_SKIPPED].append((report.nodeid, reason))


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    if not in_ci():
        return
    surprises = unexpected(config.stash[_SKIPPED])
    if surprises:
        terminalreporter.section("unexpected skips (CI=true)", red=True)
        for test, reason in surprises:
            terminalreporter.line(f"{test}: {reason}")
        terminalreporter.line(
            "Each skip in CI must be listed in tests/_skips.py with the reason it is "
            "expected; install what the test needs instead (see .ci/run)."
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if in_ci() and unexpected(session.config.stash[_SKIPPED]) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
