"""The docs' map of the code stays true to the code, and the docs' links lead somewhere.

docs/architecture.md names every module of ``worker/`` (in its section on the worker)
and every operation of the state protocols (the members of the ``Protocol`` classes in
``adapters/state.py``, each in its protocol's row of the tables there), so a module or
an operation added without a word there fails here. Every relative link between the
Markdown files (README.md, docs/, docs/design/) points at a file that exists and, when
it names a heading, at a heading of that file.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
WORKER = ROOT / "src" / "pgwork" / "worker"
STATE_PROTOCOLS = ROOT / "src" / "pgwork" / "adapters" / "state.py"
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def named_in_section(title: str) -> set[str]:
    """Every name written as code (between backticks) in the section of
    docs/architecture.md headed ``## {title}``, up to the next such heading: a module
    of ``postgres/`` that shares a worker module's name does not count for it."""
    text = ARCHITECTURE.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    return set(re.findall(r"`([^`\n]+)`", section))


def worker_modules() -> list[str]:
    """The worker's modules, as the table names them (``_side/lease.py``); a
    sub-package's ``__init__.py`` holds only its docstring, and is not listed."""
    return sorted(
        str(path.relative_to(WORKER))
        for path in WORKER.rglob("*.py")
        if path.parent == WORKER or path.name != "__init__.py"
    )


def worker_table() -> list[str]:
    """The modules in the rows of the worker's table, top to bottom."""
    section = ARCHITECTURE.read_text().split("\n## The worker\n")[1].split("\n## ")[0]
    return re.findall(r"^\| `([^`]+\.py)` \|", section, re.MULTILINE)


def worker_imports(module: str) -> set[str]:
    """The worker modules ``module`` imports (as the table names them)."""
    tree = ast.parse((WORKER / module).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    prefix = "pgwork.worker."
    found = set()
    for name in names:
        if name.startswith(prefix):
            path = name[len(prefix) :].replace(".", "/") + ".py"
            if (WORKER / path).exists() and path != module:
                found.add(path)
    return found


def protocol_operations() -> list[tuple[str, str]]:
    """(protocol, operation) for each method or property of each ``Protocol`` class."""
    tree = ast.parse(STATE_PROTOCOLS.read_text())
    operations = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        if "Protocol" not in {ast.unparse(base) for base in node.bases}:
            continue
        for member in node.body:
            is_operation = isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef)
            if is_operation and not member.name.startswith("_"):
                operations.append((node.name, member.name))
    return operations


def test_the_code_has_modules_and_operations_to_check() -> None:
    # Guards the two listings below against reading nothing (a moved file, a renamed
    # class) and so passing having checked nothing.
    assert {"_loop.py", "_atomic_group.py", "_side/lease.py"} <= set(worker_modules())
    assert {"_loop.py", "_slot.py", "_side/watchdog.py"} <= set(worker_table())
    operations = {name for _, name in protocol_operations()}
    assert {"acquire", "complete_and_acquire", "renew_in_line", "adopt_sync"} <= operations
    assert len(operations) > 40


@pytest.mark.parametrize("module", worker_modules())
def test_every_worker_module_is_named_in_the_architecture(module: str) -> None:
    assert module in named_in_section("The worker"), (
        f"docs/architecture.md does not name worker/{module} under 'The worker': add it "
        "to the table of the worker's modules, with its one job"
    )


@pytest.mark.parametrize("module", worker_modules())
def test_a_worker_module_imports_only_modules_further_down_the_table(module: str) -> None:
    """The table reads from the loop down: each module builds on those below it, and
    never on one above."""
    table = worker_table()
    assert module in table
    above = set(table[: table.index(module)])
    assert not worker_imports(module) & above, (
        f"worker/{module} imports {sorted(worker_imports(module) & above)}, which "
        "docs/architecture.md lists above it: reorder the table, or the imports"
    )


@pytest.mark.parametrize(
    ("protocol", "operation"), protocol_operations(), ids=lambda value: str(value)
)
def test_every_state_protocol_operation_is_named_in_the_architecture(
    protocol: str, operation: str
) -> None:
    section = ARCHITECTURE.read_text().split("\n## The state protocols, by role\n")[1]
    rows = [line for line in section.splitlines() if line.startswith(f"| `{protocol}` |")]
    assert rows, f"docs/architecture.md has no table row for the protocol {protocol}"
    assert f"`{operation}`" in rows[0], (
        f"docs/architecture.md does not name {protocol}.{operation}: add it to the row of "
        f"`{protocol}` under 'The state protocols, by role'"
    )


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, code marks and punctuation
    dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [
        target
        for target in LINK.findall(text)
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def test_there_are_links_to_check() -> None:
    assert sum(len(relative_links(page)) for page in PAGES) > 20


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_between_the_docs_resolve(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked.relative_to(ROOT)}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
