"""Where the suite's time goes: a pytest plugin that records, for every test, the wall seconds of its setup, body and
teardown with the machine's busy CPU seconds in each (all processes: Ray workers, servers and subprocesses a test
starts count too), and the wall seconds of every fixture's setup. Loaded by tests/conftest.py when
``TANDEM_TEST_PROFILE=<file.jsonl>`` is set; ``python scripts/test_profile.py <file.jsonl>`` prints the tables.

Machine CPU, not the process's own: on a 2-core box the question is whether a test keeps the cores busy (then only
less work makes it faster) or waits (then it could overlap with another).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

_TICKS = os.sysconf("SC_CLK_TCK")


def busy_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all cores; /proc/stat's first line minus idle and iowait)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / _TICKS


class Profile:
    def __init__(self, path: Path) -> None:
        self.out = open(path, "w")  # noqa: SIM115 - closed at session end
        self.started = time.monotonic()

    def write(self, **record) -> None:
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    def phase(self, item: pytest.Item, when: str):
        wall, cpu = time.monotonic(), busy_cpu_s()

        def done() -> None:
            self.write(kind="phase", nodeid=item.nodeid, when=when, wall_s=round(time.monotonic() - wall, 3),
                       cpu_s=round(busy_cpu_s() - cpu, 2), at_s=round(wall - self.started, 1))
        return done

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        done = self.phase(item, "setup")
        yield
        done()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        done = self.phase(item, "call")
        yield
        done()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item):
        done = self.phase(item, "teardown")
        yield
        done()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        wall = time.monotonic()
        yield
        self.write(kind="fixture", name=fixturedef.argname, scope=fixturedef.scope,
                   wall_s=round(time.monotonic() - wall, 3), nodeid=request.node.nodeid)

    def pytest_sessionfinish(self, session):
        self.write(kind="session", wall_s=round(time.monotonic() - self.started, 1))
        self.out.close()
