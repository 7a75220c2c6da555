#!/usr/bin/env python3
"""The two commands a developer needs, with nothing installed beforehand.

    python3 scripts/dev.py test [pytest args...]   run the whole test suite, what CI runs
    python3 scripts/dev.py test --fast [args...]   the everyday tier, about 25 minutes on
                                                   two cores: no fault injection, pooler,
                                                   browser or benchmark tests
    python3 scripts/dev.py demo [args...]          run `pgwork demo`
    python3 scripts/dev.py lint                    ruff, ruff format, mypy, import-linter

Each command first makes sure `.venv` exists and holds pgwork installed editable with
its `dev` extra (with `uv` when it is on PATH, else venv + pip). The install is redone
only when pyproject.toml changes: its hash is kept in a stamp file inside `.venv`.
Standard library only, Python 3.11+.
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


def _install_fingerprint() -> str:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    digest.update(sys.version.encode())
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
        "installing pgwork (editable) and its dev dependencies into "
        f"{VENV.relative_to(ROOT)}: a minute or two the first time, again only when "
        "pyproject.toml changes"
    )
    target = f"{ROOT}[dev]"
    started = time.monotonic()
    if uv:
        _must([uv, "pip", "install", "--python", str(PYTHON), "-e", target])
    else:
        # pip's own lines (one per package) are the progress display.
        _must([str(PYTHON), "-m", "pip", "install", "--disable-pip-version-check", "-e", target])
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
