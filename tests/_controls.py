"""``--without-controls``: leave out the control cases.

A control case is a parametrization whose id has a part ``control`` or starting with
``control-`` (``[control-deaf]``, ``[atomic-control-unswept]``): the test run against a
build with one mechanism removed, to show that the test notices. It proves the test,
not the library, so a second pass over another server or event loop may leave it out.
"""

from __future__ import annotations

import re

import pytest

__all__ = ["is_control"]

_CONTROL = re.compile(r"(^|-)control(-|$)")


def is_control(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and _CONTROL.search(callspec.id) is not None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--without-controls",
        action="store_true",
        help="leave out the control cases (parametrization ids with a 'control' part)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--without-controls"):
        return
    kept = [item for item in items if not is_control(item)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if is_control(item)])
        items[:] = kept
