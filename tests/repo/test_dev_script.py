"""scripts/dev.py, the README's entry point: its everyday tier (``test --fast``) leaves
out the slow parts, and only those; the whole suite includes the benchmark's tests; the
install says what it does and is redone when what it reads changes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_dev() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pgwork_dev_script", ROOT / "scripts/dev.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arguments_without_fast_go_to_pytest_unchanged() -> None:
    dev = load_dev()
    assert dev.pytest_args(["-k", "enqueue", "tests/engine"]) == ["-k", "enqueue", "tests/engine"]


def test_every_path_the_fast_tier_leaves_out_exists() -> None:
    """A renamed directory would otherwise silently put its slow tests back in."""
    dev = load_dev()
    paths = [arg.split("=", 1)[1] for arg in dev.FAST_TIER if arg.startswith("--ignore")]
    assert paths
    assert [p for p in paths if not list(ROOT.glob(p))] == []


@pytest.mark.timeout(120)
def test_fast_tier_collects_no_fault_pooler_browser_or_benchmark_test() -> None:
    dev = load_dev()
    collected = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            *dev.pytest_args(["--fast"]),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    ids = [line for line in collected.stdout.splitlines() if "::" in line]

    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    assert len(ids) > 500  # the everyday tier is most of the suite
    slow = [
        i
        for i in ids
        if i.startswith(("tests/faults/", "tests/pooler/"))
        or "tests/dashboard/test_browser" in i
        or i.startswith("bench/")
    ]
    assert slow == []
    assert any(i.startswith("tests/engine/") for i in ids)


@pytest.mark.timeout(120)
def test_the_whole_suite_includes_the_benchmarks_tests() -> None:
    """``dev.py test`` with no path runs pytest's testpaths: bench/tests must be one."""
    dev = load_dev()
    collected = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            # The library's tests (the test above collects them); a glob, since pytest
            # never ignores a path it was given, and tests/ is one of the testpaths too.
            "--ignore-glob=tests/*",
            *dev.pytest_args([]),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    ids = [line for line in collected.stdout.splitlines() if "::" in line]

    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    assert any(i.startswith("bench/tests/test_smoke.py::") for i in ids)
    assert any(i.startswith("bench/tests/test_dashboard.py::") for i in ids)


def _fake_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[ModuleType, list[list[str]]]:
    """scripts/dev.py over a checkout in ``tmp_path`` whose venv exists but holds no
    current install; the install commands it would run are recorded, not run."""
    dev = load_dev()
    python = tmp_path / "venv/bin/python"
    python.parent.mkdir(parents=True)
    python.touch()
    monkeypatch.setattr(dev, "VENV", tmp_path / "venv")
    monkeypatch.setattr(dev, "ROOT", tmp_path)
    monkeypatch.setattr(dev, "PYTHON", python)
    monkeypatch.setattr(dev, "STAMP", tmp_path / "venv/.stamp")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench/pyproject.toml").write_text("[project]\nname = 'x-bench'\n")
    monkeypatch.setattr(dev.shutil, "which", lambda name: None)
    ran: list[list[str]] = []
    monkeypatch.setattr(dev, "_must", lambda command: ran.append(list(command)))
    return dev, ran


def test_the_install_says_what_it_does_and_shows_pips_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first run installs for a minute or more: it says so before it starts, lets
    pip print its lines rather than running it quietly, and says how long it took."""
    dev, ran = _fake_venv(tmp_path, monkeypatch)

    dev.ensure_environment()

    said = capsys.readouterr().err
    assert "installing pgwork" in said
    assert "a minute or two the first time" in said
    assert "installed in " in said
    assert ran
    assert all(command[1:4] == ["-m", "pip", "install"] for command in ran)
    assert all("--quiet" not in command for command in ran)


def test_pip_is_brought_to_one_that_reads_dependency_groups_before_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The developer's tools are the ``dev`` dependency group, which pip reads from 25.1
    on; a venv created by Python 3.11 or 3.12 starts with an older pip."""
    dev, ran = _fake_venv(tmp_path, monkeypatch)

    dev.ensure_environment()

    [upgrade, install] = ran
    pip = ["-m", "pip", "install", "--disable-pip-version-check"]
    assert upgrade[1:] == [*pip, "pip>=25.1"]
    assert install[1:] == [
        *pip,
        *("-e", f"{tmp_path}[asyncpg,binary,dashboard,embedded,nats,prometheus,redis,uvloop]"),
        *("-e", str(tmp_path / "bench")),
        *("--group", "dev"),
    ]


def test_the_install_is_redone_when_either_pyproject_changes_and_only_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev, ran = _fake_venv(tmp_path, monkeypatch)
    dev.ensure_environment()
    installs = len(ran)
    assert installs > 0

    dev.ensure_environment()
    assert len(ran) == installs  # current: nothing to do

    (tmp_path / "bench/pyproject.toml").write_text("[project]\nname = 'x-bench2'\n")
    dev.ensure_environment()
    assert len(ran) == 2 * installs

    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'y'\n")
    dev.ensure_environment()
    assert len(ran) == 3 * installs
