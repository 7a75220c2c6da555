"""The suite runs on the event loop ``PGWORK_TEST_LOOP`` names: a pass meant to run
pgwork on uvloop must not quietly run it on asyncio's own loop."""

from __future__ import annotations

import asyncio

import pytest
from tests._loop import TEST_LOOP, run

pytestmark = pytest.mark.anyio


async def test_async_tests_run_on_the_chosen_event_loop() -> None:
    loop = type(asyncio.get_running_loop())
    assert loop.__module__.startswith("uvloop") == (TEST_LOOP == "uvloop"), loop


def test_helpers_start_the_chosen_event_loop() -> None:
    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run(which).startswith("uvloop") == (TEST_LOOP == "uvloop")
