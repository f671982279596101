"""Work that a selected test waits for, started with the first session-cluster test (tests/conftest.py) in a process of
its own at low CPU priority (nice 10): it runs while the first tests, single-threaded ones, leave a core of this 2-core
box idle, instead of in the waiting test's own time. Each keeps its output in a log file named in its errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class Background:
    """``cmd`` (``{folder}`` in it: a folder of its own) run from the repo root; ``wait`` returns its exit code."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="background_"))
        self.log = self.folder / "output.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([part.format(folder=self.folder) for part in cmd], cwd=ROOT, stdout=log,
                                         stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                         preexec_fn=lambda: os.nice(10))

    def wait(self, timeout_s: float = 900.0) -> int:
        return self.proc.wait(timeout=timeout_s)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


# by the name of the fixture that waits for it
STARTED = pytest.StashKey[dict[str, Background]]()
# the fixtures the selected session-cluster tests use (set when the session is collected)
WANTED = pytest.StashKey[set[str]]()


def started(request: pytest.FixtureRequest) -> Background:
    """The background process started for the session for this fixture (``request.fixturename``)."""
    job = request.config.stash.get(STARTED, {}).get(request.fixturename)
    assert job is not None, f"tests/conftest.py starts nothing for {request.fixturename}"
    return job
