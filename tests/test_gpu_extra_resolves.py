"""The GPU extra (``pip install -e '.[vllm]'``) resolves together with the project's own pins.

pip resolves it against the package index without installing anything (``--dry-run --ignore-installed``): the
versions a GPU machine would get, read from pip's report. verl 0.9.1's own ``[vllm]`` extra pins vLLM; the
resolution must keep verl, Ray and transformers at the versions the project is tested with. The project's metadata
is built with the venv's own setuptools (``--no-build-isolation``; an isolated build env would first download and
install setuptools, ~20 s of every CI run).
"""

import json
import sys
from pathlib import Path

import pytest

from tests.background import started

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]


# Started when the session is collected (tests/background.py): pip waits on the index most of its ~45 s.
RESOLVE = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-build-isolation", "--quiet",
           "--report", "{folder}/report.json", f"{ROOT}[vllm]"]


@pytest.fixture
def vllm_extra_resolution(request) -> tuple[int, str, Path]:
    """pip's exit code, output and report, from the background process started when the session was collected."""
    job = started(request)
    return job.wait(600), job.output(), job.folder / "report.json"


def test_vllm_extra_resolves_with_our_pins(vllm_extra_resolution):
    code, output, report = vllm_extra_resolution
    if code != 0 and ("No matching distribution" in output or "connection" in output.lower()):
        pytest.skip(f"the package index is not reachable: {output.strip().splitlines()[-1]}")
    assert code == 0, output[-3000:]
    versions = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                for item in json.loads(report.read_text())["install"]}
    print({name: versions.get(name) for name in ("vllm", "torch", "transformers", "verl", "ray")})
    assert versions["verl"] == "0.9.1" and versions["ray"] == "2.60.0"
    assert versions["vllm"].startswith("0.24.")  # verl 0.9.1's [vllm] pin
    major, minor = (int(x) for x in versions["transformers"].split(".")[:2])
    assert (5, 0) <= (major, minor) < (5, 11)  # setup.cfg's transformers pin (verl's ceiling)
