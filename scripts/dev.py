#!/usr/bin/env python3
"""The two commands a developer needs, with nothing installed beforehand.

    python3 scripts/dev.py test [pytest args...]   run the test suite
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
    _say("installing pgwork (editable, with the dev extra)")
    target = f"{ROOT}[dev]"
    if uv:
        _must([uv, "pip", "install", "--python", str(PYTHON), "-e", target])
    else:
        _must([str(PYTHON), "-m", "pip", "install", "--quiet", "-e", target])
    STAMP.write_text(fingerprint + "\n")


def test(args: list[str]) -> int:
    return _run([str(PYTHON), "-m", "pytest", *args])


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
