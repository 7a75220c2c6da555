"""No file under version control keeps the markers of a merge conflict.

A conflict resolved in a docstring or a Markdown file breaks no import and no test of
behaviour, so it would otherwise reach main unseen.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(rb"^(<{7}|={7}|>{7})(\s|$)", re.MULTILINE)


def test_no_tracked_file_keeps_conflict_markers() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    marked = []
    for name in filter(None, listed):
        path = ROOT / name.decode()
        if not path.is_file() or path.suffix in {".png", ".ico", ".woff2"}:
            continue
        if MARKER.search(path.read_bytes()):
            marked.append(name.decode())
    assert marked == []
