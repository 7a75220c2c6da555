"""Each conformance case says which capabilities of the contract it needs.

A store that offers only the core (``CoreStateAdapter``) runs the cases that need
nothing more and skips the others, so a case that calls a capability's operation (or
enqueues blocked jobs, ``ChainBlockers``' feature) without ``requires`` saying so
would fail such a store for the wrong reason. Each case's source, with the suite's
helper methods and functions it calls, is read for those operations (and for
``blockers=``, ``children=`` and ``wait_signal=``, the jobs that need ``ChainBlockers``
or ``ChainSignals`` to be written).
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from pgwork.adapters import state
from pgwork.adapters.capabilities import CAPABILITY_PROTOCOLS, operations
from pgwork.testing.conformance import StateAdapterConformance
from pgwork.testing.conformance._harness import required_capabilities

CORE = state.CoreStateAdapter


OWNER = {name: capability for capability in CAPABILITY_PROTOCOLS for name in operations(capability)}


def cases() -> list[tuple[str, Callable[..., Any]]]:
    return sorted(
        (name, member)
        for name, member in inspect.getmembers(StateAdapterConformance)
        if name.startswith("test_") and callable(member)
    )


def helpers(function: Callable[..., Any]) -> dict[str, str]:
    """The source of each function and method defined at the top of the module that
    holds ``function`` or in its classes (nested functions are in their caller's)."""
    tree = ast.parse(inspect.getsource(inspect.getmodule(function)))  # type: ignore[arg-type]
    found: dict[str, str] = {}
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        for member in members:
            if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                found[member.name] = ast.unparse(member)
    return found


def needed(function: Callable[..., Any]) -> set[type]:
    """The capabilities whose operations ``function`` calls, itself or through the
    helpers of its module it calls."""
    known = helpers(function)
    seen = {function.__name__}
    pending = [textwrap.dedent(inspect.getsource(function))]
    found: set[type] = set()
    while pending:
        source = pending.pop()
        for called in re.findall(r"\.(\w+)\(", source):
            if called in OWNER:
                found.add(OWNER[called])
        if re.search(r"\b(blockers|children)=", source):
            found.add(state.ChainBlockers)
        if re.search(r"\bwait_signal=", source):
            found.add(state.ChainSignals)
        for called in re.findall(r"\b(\w+)\(", source):
            if called in known and called not in seen and not called.startswith("test_"):
                seen.add(called)
                pending.append(known[called])
    return found


def test_the_capabilities_split_the_contract_with_the_core() -> None:
    # Guards the check below against reading nothing, and the split against overlaps.
    assert len(cases()) > 150
    core = operations(CORE)
    assert {"acquire", "complete", "insert_jobs"} <= core
    assert {"complete_and_acquire", "open_atomic_group", "next_due"} <= set(OWNER)
    assert not core & set(OWNER)
    assert core | set(OWNER) == operations(state.StateAdapter)


@pytest.mark.parametrize(("name", "case"), cases(), ids=[name for name, _ in cases()])
def test_each_case_requires_the_capabilities_it_uses(name: str, case: Callable[..., Any]) -> None:
    missing = needed(case) - set(required_capabilities(case))
    assert not missing, (
        f"{name} uses {sorted(c.__name__ for c in missing)}: mark it (or its suite class) "
        "with @requires(...)"
    )


@pytest.mark.parametrize(("name", "case"), cases(), ids=[name for name, _ in cases()])
def test_each_case_requires_only_capabilities(name: str, case: Callable[..., Any]) -> None:
    assert set(required_capabilities(case)) <= set(CAPABILITY_PROTOCOLS)
