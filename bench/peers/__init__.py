"""Peers: the same workloads on oban-py, PgQueuer and procrastinate, side by side, and
the raw-SQL floor beside them.

The peers live in a virtualenv of their own, outside the repository (default
``$XDG_CACHE_HOME/pgwork-bench/peers-venv``) and never among pgwork's dependencies. Each
runs as a subprocess (``run_<script>.py``, which imports no pgwork) through its public
API on a fresh database of the same server, in the same run, so ratios compare like
with like. The raw-SQL floor (``run_raw.py``: bare SQL through psycopg, no library)
needs no virtualenv: it runs under the benchmark's own Python, in its own process too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._cost import CostMeter
from bench._env import PgworkDatabases, fresh_database
from bench._loop import current
from bench._plan import (
    BEST_SETTINGS,
    ROW_DRAIN_BEST,
    Sizes,
    percentile,
    row_drain,
    row_enqueue,
    row_latency,
)
from bench._progress import Bars
from bench._report import Cost, Measurement

__all__ = [
    "FLOOR",
    "PEERS",
    "ROWS",
    "PeerSpec",
    "Peers",
    "default_venv",
    "ensure_venv",
    "prepare_peers",
    "run_peer",
]

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class PeerSpec:
    """How to run one column: ``run_<script>.py`` with ``args``, from ``dist`` (a
    distribution in the peers' virtualenv; None: the benchmark's own Python)."""

    script: str
    dist: str | None
    args: tuple[str, ...] = ()
    workloads: tuple[str, ...] = ("enqueue", "drain", "latency")
    # What ``--concurrency`` sets, for the "best" row's note; None: the script has no
    # such knob, and its one drain is its best.
    knob: str | None = None
    # The event loop the library's own command line runs its worker on, where uvloop
    # is installed (the peers' virtualenv has it: PgQueuer depends on it); None: the
    # harness's, which pgwork runs on (the raw floor's, so floor and pgwork share one).
    loop: str | None = None
    # Whether it runs on a database with pgwork's schema (else an empty one).
    pgwork_schema: bool = False


FLOOR = "raw"
# The floor's enqueue of pgwork's own rows into pgwork's table.
ROWS = "raw-rows"
_USUAL = ("enqueue", "drain", "latency")
# Column name -> how to run it. oban-py needs Python 3.12+.
# The loops: `oban start` and `pgq run` run on uvloop when it can be imported (oban-py's
# and PgQueuer's cli.py), `procrastinate worker` on asyncio.run.
PEERS = {
    "oban": PeerSpec("oban", "oban", loop="uvloop"),
    "pgqueuer-asyncpg": PeerSpec(
        "pgqueuer",
        "pgqueuer",
        ("--driver", "asyncpg"),
        (*_USUAL, "best"),
        "batch_size",
        loop="uvloop",
    ),
    "pgqueuer-psycopg": PeerSpec(
        "pgqueuer",
        "pgqueuer",
        ("--driver", "psycopg"),
        (*_USUAL, "best"),
        "batch_size",
        loop="uvloop",
    ),
    "procrastinate": PeerSpec("procrastinate", "procrastinate", loop="asyncio"),
    # The floor's drain is already its best (4 connections, claims of 100): as is.
    FLOOR: PeerSpec("raw", None, workloads=("enqueue", "drain", "best")),
    ROWS: PeerSpec("raw", None, ("--rows", "pgwork"), workloads=("enqueue",), pgwork_schema=True),
}
DISTRIBUTIONS = ("oban", "pgqueuer", "procrastinate")
# Drivers whose versions the report names (PgQueuer runs on both).
DRIVERS = ("asyncpg", "psycopg")
COMMON = ["psycopg[binary]>=3.2", "psycopg-pool>=3.2", "asyncpg", "uvloop"]
RUN_LIMIT = 1200.0


def default_venv() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "pgwork-bench" / "peers-venv"


def _version_ok(python: str) -> bool:
    try:
        done = subprocess.run(
            [python, "-c", "import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)"],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _python_for_peers() -> tuple[str, bool]:
    """A Python for the peers' venv, and whether it is new enough for oban-py (3.12+)."""
    candidates = [sys.executable, "python3.13", "python3.12"]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if pyenv.is_dir():
        candidates += [str(p / "bin" / "python3") for p in sorted(pyenv.glob("3.1[2-9]*"))]
    for candidate in candidates:
        found = shutil.which(candidate) or (candidate if Path(candidate).is_file() else None)
        if found and _version_ok(found):
            return found, True
    return sys.executable, False


def ensure_venv(venv: Path, log: Callable[[str], None]) -> tuple[str, dict[str, str]]:
    """Create or reuse the peers' venv; return its python and the installed versions."""
    python = venv / "bin" / "python"
    stamp = venv / ".pgwork-bench-peers"
    wanted = json.dumps({"peers": DISTRIBUTIONS, "common": COMMON})
    if not (python.exists() and stamp.exists() and stamp.read_text() == wanted):
        base, modern = _python_for_peers()
        requirements = [*COMMON, "procrastinate", "pgqueuer"]
        if modern:
            requirements.append("oban")
        else:
            log("[yellow]no Python 3.12+ found: oban-py (which needs it) will be skipped")
        log(f"installing peers into {venv} (once): {', '.join(requirements)}")
        if venv.exists():
            shutil.rmtree(venv)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *requirements],
            check=True,
        )
        stamp.write_text(wanted)
    listing = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for name in sys.argv[1:]:\n"
            "    try: out[name] = m.version(name)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))",
            *DISTRIBUTIONS,
            *DRIVERS,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return str(python), json.loads(listing.stdout)


async def _run_script(
    python: str,
    spec: PeerSpec,
    dsn: str,
    arguments: list[str],
    progress: Callable[[int], None],
    *,
    metered: tuple[str, int] | None = None,
) -> tuple[dict[str, Any], str, Cost | None]:
    """Run ``run_<script>.py`` on ``dsn``; return its result, note and, when ``metered``
    (the admin DSN and the run's job count), what each job cost from the runner's mark
    to its result."""
    script = f"run_{spec.script}.py"
    proc = await asyncio.create_subprocess_exec(
        python,
        str(HERE / script),
        "--dsn",
        dsn,
        "--loop",
        spec.loop or current(),
        *spec.args,
        *arguments,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=str(HERE),
    )
    result: dict[str, Any] | None = None
    note = ""
    meter = None if metered is None else CostMeter(proc.pid, dsn, metered[0])
    if meter is not None:
        await meter.connect()

    async def read() -> None:
        nonlocal result, note
        assert proc.stdout is not None
        async for raw in proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if "progress" in event:
                progress(int(event["progress"]))
            elif "mark" in event:
                if meter is not None:
                    await meter.open()
            elif "result" in event:
                result = event["result"]
                if meter is not None:
                    await meter.close()
            elif "note" in event:
                note = str(event["note"])

    assert proc.stderr is not None
    try:
        _, stderr = await asyncio.wait_for(
            asyncio.gather(read(), proc.stderr.read()), timeout=RUN_LIMIT
        )
        await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    finally:
        if meter is not None:
            await meter.close()
    if proc.returncode != 0 or result is None:
        tail = stderr.decode(errors="replace").strip().splitlines()[-5:]
        raise RuntimeError(f"{script} exited {proc.returncode}: {' | '.join(tail)}")
    cost = None if meter is None or metered is None else meter.per_job(metered[1])
    return result, note, cost


async def _peer_workload(
    python: str,
    peer: str,
    admin_dsn: str,
    bars: Bars,
    sizes: Sizes,
    workload: str,
    database: Callable[[], AbstractContextManager[str]],
) -> list[Measurement]:
    """``database``: a fresh database for one run (with pgwork's schema if the column
    asks for it)."""
    spec = PEERS[peer]
    out: list[Measurement] = []
    slots = ["--concurrency", str(sizes.slots)]
    if workload == "enqueue":
        n = sizes.enqueue
        for batch in (None, 100, 1000):
            row = row_enqueue(batch)
            bar = bars.bar(f"{peer}: {row}", n)
            with database() as dsn:
                args = ["--workload", "enqueue", "--jobs", str(n), "--batch", str(batch or 0)]
                result, note, cost = await _run_script(
                    python, spec, dsn, args, bar.set, metered=(admin_dsn, n)
                )
            rate = n / result["seconds"]
            bar.finish(f"{rate:,.0f} jobs/s")
            out.append(Measurement(row, peer, rate, "jobs/s", cost=cost))
    elif workload == "drain":
        drained = await _peer_drain(python, peer, admin_dsn, bars, sizes, sizes.slots)
        out.append(drained)
    elif workload == "best":
        if spec.knob is None:
            drained = await _peer_drain(python, peer, admin_dsn, bars, sizes, sizes.slots)
            out.append(
                dataclasses.replace(drained, row=ROW_DRAIN_BEST, note=f"as is: {drained.note}")
            )
        else:
            tried = [
                (s, await _peer_drain(python, peer, admin_dsn, bars, sizes, s))
                for s in BEST_SETTINGS
            ]
            setting, fastest = max(tried, key=lambda t: t[1].value)
            rates = ", ".join(f"{s}: {m.value:,.0f}" for s, m in tried)
            note = f"{spec.knob}={setting}, the best of {spec.knob} {rates} jobs/s"
            out.append(dataclasses.replace(fastest, row=ROW_DRAIN_BEST, note=note))
    elif workload == "latency":
        n = sizes.latency
        bar = bars.bar(f"{peer}: idle pickup latency", n)
        with fresh_database(admin_dsn) as dsn:
            args = ["--workload", "latency", "--jobs", str(n), *slots]
            args += ["--interval", str(sizes.latency_interval)]
            result, note, _ = await _run_script(python, spec, dsn, args, bar.set)
        samples = [float(x) for x in result["latencies_ms"]]
        bar.finish(f"p50 {percentile(samples, 50):.1f} ms")
        out += [
            Measurement(row_latency(p), peer, percentile(samples, p), "ms", False)
            for p in (50, 95, 99)
        ]
    return out


async def _peer_drain(
    python: str, peer: str, admin_dsn: str, bars: Bars, sizes: Sizes, concurrency: int
) -> Measurement:
    """One drain of ``sizes.drain`` jobs at ``--concurrency``: its row, with jobs/s, the
    runner's note and what each job cost."""
    n = sizes.drain
    row = row_drain(concurrency)
    bar = bars.bar(f"{peer}: {row}", n)
    with fresh_database(admin_dsn) as dsn:
        args = ["--workload", "drain", "--jobs", str(n), "--concurrency", str(concurrency)]
        result, note, cost = await _run_script(
            python, PEERS[peer], dsn, args, bar.set, metered=(admin_dsn, n)
        )
    rate = n / (result["finished"] - result["first"])
    bar.finish(f"{rate:,.0f} jobs/s")
    return Measurement(row, peer, rate, "jobs/s", note=note, cost=cost)


@dataclass
class Peers:
    """The peers' virtualenv (its python, None if it could not be made) and the installed
    version of each distribution; the raw-SQL floor needs neither."""

    python: str | None
    versions: dict[str, str] = field(default_factory=dict)

    def available(self, workload: str) -> list[str]:
        """The columns that run ``workload``, in table order."""
        return [
            peer
            for peer, spec in PEERS.items()
            if workload in spec.workloads
            and (spec.dist is None or (self.python and spec.dist in self.versions))
        ]

    def describe(self) -> str:
        names = [*DISTRIBUTIONS, *DRIVERS]
        installed = ", ".join(f"{d} {self.versions[d]}" for d in names if d in self.versions)
        loops = ", ".join(
            f"{peer} on {spec.loop}" for peer, spec in PEERS.items() if spec.loop is not None
        )
        return (
            f"{installed or 'none installed'}; the raw-SQL floor under psycopg {_psycopg()} "
            f"on pgwork's event loop ({current()}); {loops}"
        )


def _psycopg() -> str:
    import psycopg

    return psycopg.__version__


async def prepare_peers(venv: Path | None, log: Callable[[str], None]) -> Peers:
    """Create or reuse the peers' virtualenv (raises OSError / CalledProcessError)."""
    python, versions = await asyncio.to_thread(ensure_venv, venv or default_venv(), log)
    missing = [d for d in DISTRIBUTIONS if d not in versions]
    if missing:
        log(f"[yellow]not installed in the peers' virtualenv: {', '.join(missing)}")
    return Peers(python, versions)


async def run_peer(
    peers: Peers,
    peer: str,
    workload: str,
    dbs: PgworkDatabases,
    bars: Bars,
    sizes: Sizes,
) -> list[Measurement]:
    """Run one workload on one peer (or the raw-SQL floor) on ``dbs``' server."""
    spec = PEERS[peer]
    python = sys.executable if spec.dist is None else peers.python
    assert python is not None, "available() offers no venv peer without a venv"
    admin_dsn = dbs.admin_dsn

    def database() -> AbstractContextManager[str]:
        return dbs.fresh() if spec.pgwork_schema else fresh_database(admin_dsn)

    return await _peer_workload(python, peer, admin_dsn, bars, sizes, workload, database)
