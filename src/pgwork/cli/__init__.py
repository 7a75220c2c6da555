"""The ``pgwork`` command: the one place that reads argv and the environment.

The library (everything else under ``pgwork``) never imports this package. Here, one
module per command group, each defining plain click commands that never import one
another:

- ``_app``: the ``main`` click group, the exit statuses, a PgworkError as one red line;
- ``_schema``: ``migrate`` and ``check``;
- ``_worker`` (with ``_worker_target``): ``worker MODULE:ATTR`` and its signals;
- ``_operator`` (printing through ``_views`` and ``_history_views``, which are pure):
  ``jobs``, ``chains``, ``queues``, ``workers``, ``history``;
- ``_limits`` (printing through ``_limit_views``): ``limits``, flow limits at run time;
- ``_waiting`` (printing through ``_waiting_views``): ``chains waiting``, ``signals``;
- ``_operate``: what the operator commands share (a client per command, ``--json``);
- ``_demo`` (running ``_demo_run``): ``demo``;
- ``_common``: the ``--dsn``/``--schema`` options, consoles, signal handling.

A new command group (``pgwork dashboard``, say) goes in a module of its own here
(``_dashboard.py``) defining a click command or group, attached below with one
``main.add_command`` line. It imports what it serves (e.g. ``pgwork.dashboard``), never the
other way round, and imports anything heavy (a web server) inside the command function, so
that ``pgwork worker`` does not start with it loaded.
"""

from __future__ import annotations

from pgwork.cli._app import EXIT_ABANDONED, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_NOT_AT_HEAD, main
from pgwork.cli._dashboard import dashboard
from pgwork.cli._demo import demo
from pgwork.cli._limits import limits
from pgwork.cli._operator import chains, history, jobs, queues, workers
from pgwork.cli._schema import check, migrate
from pgwork.cli._waiting import signals, waiting
from pgwork.cli._worker import worker

__all__ = ["EXIT_ABANDONED", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_NOT_AT_HEAD", "main"]

main.add_command(migrate)
main.add_command(check)
main.add_command(worker)
main.add_command(demo)
main.add_command(jobs)
main.add_command(chains)
main.add_command(queues)
main.add_command(workers)
main.add_command(history)
main.add_command(limits)
main.add_command(dashboard)
main.add_command(signals)
chains.add_command(waiting)
