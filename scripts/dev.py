#!/usr/bin/env python3
"""The two commands a developer needs, with nothing installed beforehand.

    python3 scripts/dev.py test [pytest args...]   run the whole test suite, what CI runs
    python3 scripts/dev.py test --fast [args...]   the everyday tier, about 25 minutes on
                                                   two cores: no fault injection, pooler,
                                                   browser or benchmark tests
    python3 scripts/dev.py demo [args...]          run `pgwork demo`
    python3 scripts/dev.py lint                    ruff, ruff format, mypy, import-linter

Each command first makes sure `.venv` exists and holds pgwork installed editable with
the extras the suite exercises, the benchmark (bench/, a project of its own) editable
too, and the `dev` dependency group of pyproject.toml (PEP 735: the test and lint
tools); with `uv` when it is on PATH, else venv + pip, which reads dependency groups
from 25.1 on and is upgraded first when older. The install is redone only when what it
reads changes (pyproject.toml, bench/pyproject.toml, the command itself): their hash is
kept in a stamp file inside `.venv`. Standard library only, Python 3.11+.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
STAMP = VENV / ".pgwork-dev-install"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")

# pgwork's extras the suite exercises: psycopg's wheels (a libpq of their own), the
# embedded server, the dashboard, metrics, asyncpg and uvloop.
EXTRAS = "asyncpg,binary,dashboard,embedded,prometheus,uvloop"
# The first pip that installs a dependency group (`--group`).
PIP = "pip>=25.1"
# The files the install reads: a change to any of them reinstalls.
INSTALL_INPUTS = ("pyproject.toml", "bench/pyproject.toml")

LINTERS: list[tuple[str, list[str]]] = [
    ("ruff check", [str(PYTHON), "-m", "ruff", "check", "."]),
    ("ruff format", [str(PYTHON), "-m", "ruff", "format", "--check", "."]),
    ("mypy", [str(PYTHON), "-m", "mypy"]),
    ("import-linter", [str(BIN / "lint-imports")]),
]


# The everyday tier leaves out what needs minutes or extra programs: the fault-injection
# scenarios (a private cluster restarted and killed), PgBouncer, Chromium, the benchmark
# runs and the tests marked slow. CI (.ci/run) runs everything.
FAST_TIER = [
    "--ignore=tests/faults",
    "--ignore=tests/pooler",
    "--ignore-glob=tests/dashboard/test_browser*.py",
    # A glob of its files: bench/tests is one of the testpaths, and pytest never ignores
    # a path it was given (--ignore=bench/tests would leave it in).
    "--ignore-glob=bench/tests/*",
    "-m",
    "not slow",
]


def _say(message: str) -> None:
    print(f"[dev] {message}", file=sys.stderr, flush=True)


def _run(command: Sequence[str]) -> int:
    return subprocess.run(list(command), cwd=ROOT, check=False).returncode


def _must(command: Sequence[str]) -> None:
    code = _run(command)
    if code != 0:
        _say(f"failed ({code}): {' '.join(command)}")
        raise SystemExit(code)


def install_arguments() -> list[str]:
    """What follows ``pip install`` (run from the repository root): pgwork with its
    extras and the benchmark, both editable, and the ``dev`` dependency group."""
    return ["-e", f"{ROOT}[{EXTRAS}]", "-e", str(ROOT / "bench"), "--group", "dev"]


def _install_fingerprint() -> str:
    digest = hashlib.sha256(sys.version.encode())
    for name in INSTALL_INPUTS:
        digest.update(name.encode() + b"\0" + (ROOT / name).read_bytes())
    digest.update("\0".join(install_arguments()).encode())
    return digest.hexdigest()


def ensure_environment() -> None:
    """Create `.venv` and install the project into it unless it is already current."""
    uv = shutil.which("uv")
    if not PYTHON.exists():
        _say(f"creating {VENV.relative_to(ROOT)} with {'uv' if uv else 'venv'}")
        if uv:
            _must([uv, "venv", "--python", sys.executable, str(VENV)])
        else:
            _must([sys.executable, "-m", "venv", str(VENV)])
    fingerprint = _install_fingerprint()
    if STAMP.exists() and STAMP.read_text().strip() == fingerprint:
        return
    _say(
        "installing pgwork and the benchmark (editable) and the dev tools into "
        f"{VENV.relative_to(ROOT)}: a minute or two the first time, again only when "
        "pyproject.toml or bench/pyproject.toml changes"
    )
    started = time.monotonic()
    if uv:
        _must([uv, "pip", "install", "--python", str(PYTHON), *install_arguments()])
    else:
        pip = [str(PYTHON), "-m", "pip", "install", "--disable-pip-version-check"]
        # A no-op when the venv's pip is recent enough already.
        _must([*pip, PIP])
        # pip's own lines (one per package) are the progress display.
        _must([*pip, *install_arguments()])
    STAMP.write_text(fingerprint + "\n")
    _say(f"installed in {time.monotonic() - started:.0f} s")


def pytest_args(args: list[str]) -> list[str]:
    """The pytest arguments of ``dev.py test ARGS``: ``--fast`` becomes the everyday
    tier's selection, everything else goes to pytest as given."""
    if "--fast" not in args:
        return args
    return [*FAST_TIER, *(arg for arg in args if arg != "--fast")]


def test(args: list[str]) -> int:
    if "--fast" in args:
        _say(
            "the everyday tier: no fault-injection, pooler, browser or benchmark tests; "
            "about 25 minutes on two cores, with a progress line while a test runs long"
        )
    elif not args:
        _say(
            "the whole suite: the everyday tier (about 25 minutes on two cores) and the "
            "fault, pooler, browser, benchmark and slow tests, with a progress line while "
            "a test runs long (`test --fast` for the everyday tier)"
        )
    started = time.monotonic()
    code = _run([str(PYTHON), "-m", "pytest", *pytest_args(args)])
    minutes, seconds = divmod(round(time.monotonic() - started), 60)
    _say(f"tests took {minutes} min {seconds} s")
    return code


def demo(args: list[str]) -> int:
    return _run([str(BIN / "pgwork"), "demo", *args])


def lint(args: list[str]) -> int:
    failed = []
    for name, command in LINTERS:
        _say(name)
        if _run([*command, *args] if name == "ruff check" else command) != 0:
            failed.append(name)
    if failed:
        _say(f"lint failed: {', '.join(failed)}")
        return 1
    _say("lint passed")
    return 0


COMMANDS = {"test": test, "demo": demo, "lint": lint}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    ensure_environment()
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
