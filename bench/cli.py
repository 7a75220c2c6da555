"""``python -m bench``: run the workloads, show progress, print a markdown table."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import traceback
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from rich.logging import RichHandler

from bench._context import Context
from bench._env import PgworkDatabases, describe_environment, server
from bench._loop import LOOPS, current, resolve, run
from bench._pgwork_workloads import PGWORK_WORKLOADS
from bench._plan import WORKLOADS, Sizes
from bench._progress import Bars
from bench._report import Measurement, medians, render_json, render_markdown
from bench.peers import Peers, prepare_peers, run_peer

__all__ = ["main"]

PEER_WORKLOADS = ("enqueue", "drain", "best", "latency")


def _parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<8} {what}" for name, what in WORKLOADS.items())
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Measure pgwork (and optionally its peers) on one PostgreSQL server.",
        epilog=f"workloads:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--dsn",
        help="admin DSN of a server to use (it must allow CREATE DATABASE); "
        "default: a private embedded PostgreSQL, deleted afterwards",
    )
    parser.add_argument(
        "--size",
        type=float,
        default=1.0,
        help="scale every workload's job count (1.0 = full size: 20k-job drains, a 1M "
        "backlog; 0.01 for a smoke run)",
    )
    parser.add_argument(
        "--only",
        type=lambda s: [w.strip() for w in s.split(",") if w.strip()],
        default=list(WORKLOADS),
        help=f"comma-separated workloads to run (default: all of {','.join(WORKLOADS)})",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also run enqueue/drain/latency on procrastinate, PgQueuer (asyncpg and "
        "psycopg) and oban-py, installed into a separate virtualenv (see --peers-venv), "
        "and the raw-SQL floor; pgwork's enqueue and drain then run in a process of "
        "their own too",
    )
    parser.add_argument(
        "--peers-venv",
        type=Path,
        default=None,
        help="virtualenv for the peers (default: $XDG_CACHE_HOME/pgwork-bench/peers-venv)",
    )
    parser.add_argument(
        "--slots", type=int, default=10, help="worker slots / peer concurrency (default 10)"
    )
    parser.add_argument("--out", type=Path, help="also write the markdown table to this file")
    parser.add_argument(
        "--json", type=Path, help="also write the results with the environment as JSON"
    )
    parser.add_argument(
        "--loop",
        choices=LOOPS,
        default="auto",
        help="pgwork's event loop, in the harness and in its worker and enqueuer processes "
        "(default auto: uvloop when installed, as `pgwork worker` picks it); the raw floor "
        "runs on the same, each peer on the one its own command line picks",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each workload this many times, pgwork and the peers taking turns, and "
        "report each row's median run (its note gives every run's figure): on a shared "
        "machine one run's rate can move by a third",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument(
        "--fail-fast", action="store_true", help="stop at the first workload that fails"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    unknown = [w for w in args.only if w not in WORKLOADS]
    if unknown:
        _parser().error(f"unknown workload(s) {', '.join(unknown)}; choose from {list(WORKLOADS)}")
    if args.size <= 0:
        _parser().error("--size must be positive")
    if args.repeat < 1:
        _parser().error("--repeat must be at least 1")
    return run(_run(args), resolve(args.loop))


async def _run(args: argparse.Namespace) -> int:
    sizes = Sizes.scaled(args.size, slots=args.slots)
    measurements: list[Measurement] = []
    failures: list[str] = []
    with server(args.dsn) as (admin_dsn, kind):
        options = {
            "size": f"{args.size:g}",
            "workloads": ",".join(args.only),
            "repeats": str(args.repeat),
            "jobs": sizes.describe(),
            "handlers": "no-op",
            "pgwork's event loop": f"{current()} (--loop {args.loop})",
            "load average (1 min) at the start": f"{os.getloadavg()[0]:.2f}",
        }
        env = describe_environment(admin_dsn, kind, options)
        dbs = PgworkDatabases(admin_dsn)
        try:
            with Bars(quiet=args.quiet) as bars:
                _log_through(bars)
                peers = await _prepare_peers(args, bars, failures)
                if peers is not None:
                    env.options["peers"] = peers.describe()
                # With peers, pgwork's enqueue and drain run in a process of their own,
                # as each peer does, not in the harness's.
                ctx = Context(dbs=dbs, bars=bars, sizes=sizes, isolated=peers is not None)
                # Workload by workload, pgwork then each peer, so a disturbance on the
                # machine hits neighbours in the table alike.
                for name in args.only:
                    for _ in range(args.repeat):
                        runs = [("pgwork", PGWORK_WORKLOADS[name](ctx))]
                        if peers is not None and name in PEER_WORKLOADS:
                            runs += [
                                (peer, run_peer(peers, peer, name, dbs, bars, sizes))
                                for peer in peers.available(name)
                            ]
                        await _measure(runs, name, args, bars, measurements, failures)
        finally:
            dbs.close()
    measurements = medians(measurements)
    env.options["load average (1 min) at the end"] = f"{os.getloadavg()[0]:.2f}"
    table = render_markdown(env, measurements, failures=failures)
    print(table)
    if args.out:
        args.out.write_text(table)
    if args.json:
        args.json.write_text(render_json(env, measurements, failures=failures) + "\n")
    return 1 if failures else 0


async def _measure(
    runs: list[tuple[str, Coroutine[Any, Any, list[Measurement]]]],
    name: str,
    args: argparse.Namespace,
    bars: Bars,
    measurements: list[Measurement],
    failures: list[str],
) -> None:
    """Await each library's run of workload ``name`` in turn, adding what it measured
    to ``measurements`` or, if it failed, why to ``failures``."""
    for library, pending in runs:
        try:
            measurements += await pending
        except Exception as exc:
            if args.fail_fast:
                raise
            bars.log(f"[red]{library} {name} failed: {exc!r}")
            failures.append(f"{library} {name}: {exc!r}")
            if os.environ.get("PGWORK_BENCH_DEBUG"):
                traceback.print_exc()


async def _prepare_peers(args: argparse.Namespace, bars: Bars, failures: list[str]) -> Peers | None:
    if not args.peers or not any(w in PEER_WORKLOADS for w in args.only):
        return None
    try:
        return await prepare_peers(args.peers_venv, bars.log)
    except (OSError, subprocess.CalledProcessError) as exc:
        # The raw-SQL floor needs no virtualenv: it still runs.
        failures.append(f"peers: could not prepare their virtualenv: {exc!r}")
        return Peers(python=None)


def _log_through(bars: Bars) -> None:
    """Show pgwork's warnings above the progress bars instead of through them."""
    handler = RichHandler(console=bars.console, show_path=False)
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
