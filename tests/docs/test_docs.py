"""Every ```python block in README.md and docs/*.md runs, in order, per file.

Blocks of one file share a namespace (a real module, so dataclasses and pydantic resolve
their annotations) and may use top-level ``await``, as in ``python -m asyncio``. Each
file gets a fresh migrated database as ``PGWORK_DSN``. A block marked ```python no-run
is shown, not run (keep those rare: a server that never returns, a shell session).
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)

pytestmark = pytest.mark.anyio


def python_blocks(path: Path) -> list[tuple[int, str, bool]]:
    """(line number, code, runnable) of each python block in ``path``."""
    text = path.read_text()
    return [
        (text.count("\n", 0, m.start()) + 2, m.group(2), "no-run" not in m.group(1))
        for m in BLOCK.finditer(text)
    ]


def test_there_are_docs_to_run() -> None:
    assert (ROOT / "README.md").exists()
    assert {p.name for p in DOCS} >= {
        "README.md",
        "observability.md",
        "cli.md",
        "workers.md",
        "enqueue.md",
    }
    for path in DOCS:
        blocks = python_blocks(path)
        skipped = [line for line, _, runnable in blocks if not runnable]
        assert len(skipped) <= 2, f"{path.name}: too many no-run blocks at lines {skipped}"


# Only the pages with code: a parametrized case for a page with none would pass having
# run nothing. The claims of pages without code are checked by the tests they name.
DOCS_WITH_CODE = [path for path in DOCS if any(run for _, _, run in python_blocks(path))]


def test_pages_with_code_include_the_quickstart_and_the_guides() -> None:
    assert {p.name for p in DOCS_WITH_CODE} >= {"README.md", "workers.md", "enqueue.md"}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("path", DOCS_WITH_CODE, ids=lambda p: p.name)
async def test_python_blocks_run(
    path: Path, pgwork_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGWORK_DSN", pgwork_dsn)
    name = f"pgwork_docs_{path.stem.lower().replace('-', '_')}"
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        for line, code, runnable in python_blocks(path):
            if not runnable:
                continue
            source = "\n" * (line - 1) + code  # tracebacks point at the Markdown line
            compiled = compile(
                source, str(path), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
            )
            result = eval(compiled, module.__dict__)
            if inspect.iscoroutine(result):
                await result
    finally:
        sys.modules.pop(name, None)


@pytest.mark.timeout(120)
def test_readme_quickstart_pastes_into_the_asyncio_repl(pgwork_dsn: str, tmp_path: Path) -> None:
    """The README's blocks, pasted one after the other into ``python -m asyncio``: the
    REPL ends a compound statement only at a blank line, so a statement that follows an
    indented block without one is a SyntaxError there (and every name it defines is
    missing afterwards), although the same code runs as a module."""
    pasted = "\n".join(code for _, code, runnable in python_blocks(ROOT / "README.md") if runnable)
    done = subprocess.run(
        [sys.executable, "-m", "asyncio"],
        input=pasted,
        cwd=tmp_path,
        env={**os.environ, "PGWORK_DSN": pgwork_dsn},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )

    output = done.stdout + done.stderr
    assert "Traceback" not in output, output[-4000:]
    assert "SyntaxError" not in output, output[-4000:]
    # What the last blocks print: they ran, on names the earlier blocks defined.
    assert "['build_report', 'mail_report']" in output, output[-4000:]
    assert "does not match its model" in output, output[-4000:]


def test_job_type_options_table_lists_every_option() -> None:
    """docs/workers.md's table of ``job_type()`` keywords: one row per keyword, no
    more, so a new option cannot go undocumented."""
    from pgwork import JobTypeRegistry

    text = (ROOT / "docs/workers.md").read_text()
    table = text[text.index("## Job type options") :]
    table = table[: table.index("\n\n", table.index("| Option |"))]
    documented = re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE)
    keywords = [
        name
        for name, parameter in inspect.signature(JobTypeRegistry.job_type).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    assert sorted(documented) == sorted(keywords)
