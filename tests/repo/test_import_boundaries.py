"""The library never imports its own test helpers (so installing pgwork stays lean), and
enqueueing or running a worker never loads what only migrations need."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pgwork

PACKAGE = Path(pgwork.__file__).resolve().parent


def _library_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "testing" not in p.relative_to(PACKAGE).parts)


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _runs_cleanly(code: str) -> None:
    """Run ``code`` in a fresh interpreter (nothing imported yet) and expect success."""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50
    )
    assert result.returncode == 0, result.stderr


def test_no_library_module_imports_pgwork_testing() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            n for n in _imported(path) if n.startswith("pgwork.testing")
        )
        for path in _library_modules()
    }

    assert {k: v for k, v in offenders.items() if v} == {}


def test_importing_the_library_loads_no_testing_module() -> None:
    modules = [
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for p in _library_modules()
    ]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "leaked = sorted(m for m in sys.modules if m.startswith('pgwork.testing'))\n"
        "assert not leaked, leaked\n"
    )

    _runs_cleanly(code)


def test_the_engine_and_the_cli_start_without_sqlalchemy_or_alembic() -> None:
    # They cost a worker about 450 ms of start-up and 28 MiB; only `pgwork migrate`,
    # `pgwork check` and users' SQLAlchemy connections need them.
    code = (
        "import sys\n"
        "import pgwork, pgwork.cli, pgwork.worker, pgwork.postgres.state\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'alembic'})\n"
        "assert not loaded, loaded\n"
    )

    _runs_cleanly(code)
