"""A process handler whose module a handler process takes a while to import.

Imported in one of a worker's handler processes (named ``pgwork-process-...``), this
module sleeps ``PGWORK_TEST_IMPORT_SECONDS`` seconds, then, given
``PGWORK_TEST_IMPORT_MARKS`` (a directory), leaves a file named after the process's
pid there: the import is done. A test sets both in the environment its worker's
processes inherit; in the test's own process the module does neither.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

if multiprocessing.current_process().name.startswith("pgwork-process-"):
    time.sleep(float(os.environ.get("PGWORK_TEST_IMPORT_SECONDS", "0")))
    _marks = os.environ.get("PGWORK_TEST_IMPORT_MARKS")
    if _marks:
        (Path(_marks) / str(os.getpid())).touch()


def double(n: int) -> int:
    return 2 * n
