"""A seeded, randomized fault schedule against three worker processes, checked against
the contract (see ``tests/faults/_chaos.py``).

``--faults-random-seconds`` sets how long faults are injected (60 s by default, what
CI runs), ``--faults-seed`` replays a seed (CI runs ``CI_SEED``; ``random`` draws a
fresh one), ``--faults-random-kinds`` narrows the fault kinds down to a
comma-separated list (by default, and with ``all``, every kind: what CI runs). A
failure prints its seed, its schedule and the command that replays it.

The controls run a short fixed schedule against the ``unfenced`` build (completions,
renewals and atomic attempts not fenced by the lease token), with atomic leases left to
lapse (``unrenewed-atomic``) so that a second run races the first, and the
``never-counting`` build (attempts that stop counting short of ``max_attempts``): the
contract must reject both."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable

import pytest
from tests.faults._chaos import ALL_KINDS, ON_KINDS, Chaos, drain_bound, run, schedule
from tests.faults._cluster import PrivateCluster
from tests.faults._contract import check, violations
from tests.faults._oracle import Figures
from tests.faults._worker import BROKEN_ENV

# The controls' schedule: short, and with a kill and a pause among its faults.
CONTROL_SEED = 20
CONTROL_SECONDS = 15.0


# What CI runs: a fixed seed keeps its schedule the same from run to run; a fresh one
# (``--faults-seed=random``) explores.
CI_SEED = 11


def _seed(option: str | None) -> int:
    if option is None:
        return CI_SEED
    if option == "random":
        return int.from_bytes(os.urandom(4), "big")
    try:
        return int(option)
    except ValueError:
        raise pytest.UsageError(
            f"--faults-seed takes an integer or 'random', not {option!r}"
        ) from None


def _kinds(config: pytest.Config) -> tuple[str, ...]:
    named = config.getoption("--faults-random-kinds").strip()
    if not named or named == "all":
        return ALL_KINDS
    kinds = tuple(k.strip() for k in named.split(",") if k.strip())
    unknown = sorted(set(kinds) - set(ALL_KINDS))
    if unknown:
        raise pytest.UsageError(f"unknown fault kinds {unknown}; known: {', '.join(ALL_KINDS)}")
    return kinds


RUN = "tests/faults/test_random_faults.py::test_random_faults_keep_the_contract"


def _replay(seed: int, seconds: float, kinds: tuple[str, ...]) -> str:
    args = [
        "python", "-m", "pytest", RUN, f"--faults-seed={seed}",
        f"--faults-random-seconds={seconds:g}", f"--faults-random-kinds={','.join(kinds)}",
    ]  # fmt: skip
    return "PYTHONPATH=src " + shlex.join(args)


def test_random_faults_keep_the_contract(
    fault_dsn: str,
    cluster: PrivateCluster,
    request: pytest.FixtureRequest,
    report: Callable[[Figures], Figures],
) -> None:
    config = request.config
    seed = _seed(config.getoption("--faults-seed"))
    seconds = config.getoption("--faults-random-seconds")
    kinds = _kinds(config)
    replay = _replay(seed, seconds, kinds)
    print(f"randomized faults: seed {seed}; replay with: {replay}")
    plan = schedule(seed, seconds, kinds)
    chaos = run(fault_dsn, cluster, plan, progress=print)
    chaos.figures.notes["kinds"] = ",".join(kinds)
    report(chaos.figures)
    check(fault_dsn, chaos, drain_bound(), replay)


def _control(dsn: str, cluster: PrivateCluster, breakage: str) -> Chaos:
    plan = schedule(CONTROL_SEED, CONTROL_SECONDS, ON_KINDS)
    chaos = run(dsn, cluster, plan, env={BROKEN_ENV: breakage})
    chaos.figures.scenario = f"randomized faults, seed {CONTROL_SEED}, broken build: {breakage}"
    return chaos


def test_random_fault_contract_rejects_the_unfenced_build(
    fault_dsn: str, cluster: PrivateCluster, report: Callable[[Figures], Figures]
) -> None:
    # Atomic leases are renewed while their handlers run, so without lapsed leases no
    # second run would race the first: the control lets them lapse, as
    # test_broken_builds.py's outliving-jobs control does.
    chaos = _control(fault_dsn, cluster, "unrenewed-atomic,unfenced")
    report(chaos.figures)
    found = violations(fault_dsn, chaos, drain_bound())
    assert any("effect did not commit exactly once" in v for v in found), found


def test_random_fault_contract_rejects_the_never_counting_build(
    fault_dsn: str, cluster: PrivateCluster, report: Callable[[Figures], Figures]
) -> None:
    chaos = _control(fault_dsn, cluster, "never-counting")
    report(chaos.figures)
    found = violations(fault_dsn, chaos, drain_bound())
    assert any("not final" in v or "past max_attempts" in v for v in found), found
