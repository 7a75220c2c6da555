"""The worker's side tasks: what runs beside the main loop, on a timer or a signal of
its own, and never decides which job runs next.

- ``heartbeat``: the worker's registry row, and taking back dead workers' jobs;
- ``lease``: renewing the leases of the running attempts, and waiting in line for a
  row a caller holds;
- ``reaper``: taking back expired leases, one per turn of the main loop;
- ``maintenance``: cron ticks, the stuck-blocker sweep, retention, history roll-ups,
  pruning stopped workers;
- ``watchdog``: handler timeouts, and giving up on handlers that ignore cancellation;
- ``notices``: what the worker does with each notice its listener hears.

They import nothing of the main loop or the slots: the loop starts them and reads
what they report.
"""
