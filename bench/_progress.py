"""Progress bars: one rich bar per measured phase, or nothing when quiet."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

__all__ = ["Bar", "Bars"]


class Bar:
    """One phase's bar; ``set`` and ``advance`` take job counts."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress = progress
        self._task = task

    def set(self, completed: int) -> None:
        self._progress.update(self._task, completed=completed)

    def advance(self, amount: int = 1) -> None:
        self._progress.advance(self._task, amount)

    @property
    def completed(self) -> int:
        return int(self._progress.tasks[self._task].completed)

    def finish(self, note: str = "") -> None:
        total = int(self._progress.tasks[self._task].total or 0)
        self._progress.update(self._task, completed=total, note=note)


class Bars:
    """The run's progress display (a context manager), printing to stderr."""

    def __init__(self, *, quiet: bool = False) -> None:
        self.console = Console(stderr=True)
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("[green]{task.fields[note]}"),
            console=self.console,
            disable=quiet,
        )

    def __enter__(self) -> Bars:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def bar(self, description: str, total: int) -> Bar:
        return Bar(self._progress, self._progress.add_task(description, total=total, note=""))

    def log(self, message: str) -> None:
        self._progress.console.log(message)
