"""``--shard K/N``: run the K-th of N parts of the selected tests, whole files at a time.

Most of a pass of this suite is waiting (leases expiring, servers restarting, workers
polling), so N processes given the same arguments and each its own part finish in
little more than a part's time. Each file goes whole to one part, so a module's
fixtures are set up once. The parts are balanced by the number of tests: files are
taken from the largest down, each to the part with the fewest tests so far (ties to
the lowest part), which depends only on what was collected, so every process given
the same arguments makes the same parts, and together they run each test once.
"""

from __future__ import annotations

import re

import pytest

__all__ = ["parts"]

_SHARD = re.compile(r"^(\d+)/(\d+)$")


def parts(sizes: dict[str, int], count: int) -> list[list[str]]:
    """Files (name -> number of tests) divided into ``count`` parts of about as many
    tests each: the largest file first, each to the part with the fewest tests."""
    shares: list[list[str]] = [[] for _ in range(count)]
    loads = [0] * count
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        lightest = min(range(count), key=lambda i: (loads[i], i))
        shares[lightest].append(name)
        loads[lightest] += sizes[name]
    return shares


def _parse(value: str) -> tuple[int, int]:
    match = _SHARD.match(value)
    if match is None:
        raise pytest.UsageError(f"--shard takes K/N (e.g. 1/2), got {value!r}")
    index, count = int(match[1]), int(match[2])
    if not 1 <= index <= count:
        raise pytest.UsageError(f"--shard K/N needs 1 <= K <= N, got {value!r}")
    return index, count


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shard",
        metavar="K/N",
        default=None,
        help="run only the K-th of N parts of the selected tests (whole files per part)",
    )


def pytest_configure(config: pytest.Config) -> None:
    value = config.getoption("--shard")
    if value is not None:
        _parse(value)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    value = config.getoption("--shard")
    if value is None:
        return
    index, count = _parse(value)
    sizes: dict[str, int] = {}
    for item in items:
        name = item.nodeid.split("::", 1)[0]
        sizes[name] = sizes.get(name, 0) + 1
    mine = set(parts(sizes, count)[index - 1])
    kept = [item for item in items if item.nodeid.split("::", 1)[0] in mine]
    if len(kept) < len(items):
        config.hook.pytest_deselected(
            items=[item for item in items if item.nodeid.split("::", 1)[0] not in mine]
        )
        items[:] = kept
