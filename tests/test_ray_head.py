"""tests/ray_head.py's second node: started once more when it misses Ray's fixed 30 s registration deadline, never for
any other failure. ``ray`` and ``python`` are stand-in scripts here (the real two-node cluster: tests/apps/test_ray_job.py)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests import ray_head

pytestmark = pytest.mark.unit


def _fake_bin(tmp_path: Path, first_exit: str, failing_starts: int = 1) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    starts = tmp_path / "starts"
    scripts = {
        # the first `failing_starts` starts print `first_exit` and exit 1; a later one blocks, as `ray start --block` does
        "ray": f"""#!/bin/sh
echo x >> {starts}
if [ "$(wc -l < {starts})" -le {failing_starts} ]; then echo "{first_exit}"; exit 1; fi
touch {tmp_path / "up"}
exec sleep 60
""",
        # the join probe: the node is alive once a `ray start` got to blocking
        "python": f"#!/bin/sh\nif [ -e {tmp_path / 'up'} ]; then echo '[\"node-2\"]'; else echo '[]'; fi\n",
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755 | stat.S_IEXEC)
    return bin_dir


def _head() -> ray_head.RayHead:
    return ray_head.RayHead("127.0.0.1:1", "http://127.0.0.1:2", {"PATH": "/usr/bin:/bin"})


def test_a_node_that_missed_the_registration_deadline_is_started_again(tmp_path, monkeypatch):
    monkeypatch.setattr(ray_head, "BIN", _fake_bin(tmp_path, f"Exception: {ray_head.REGISTRATION_TIMEOUT}. ..."))
    monkeypatch.setattr(ray_head, "POLL_S", 0.05)
    with ray_head.ray_node(_head(), tmp_path / "node.log", 1, {"node2": 1}, tmp_path) as node_id:
        assert node_id == "node-2"
    assert (tmp_path / "starts").read_text().count("x") == 2


def test_starts_stop_after_the_attempts(tmp_path, monkeypatch):
    timeout = f"Exception: {ray_head.REGISTRATION_TIMEOUT}. ..."
    monkeypatch.setattr(ray_head, "BIN", _fake_bin(tmp_path, timeout, failing_starts=2))
    monkeypatch.setattr(ray_head, "POLL_S", 0.05)
    with pytest.raises(AssertionError, match="ray start exited with 1"):
        with ray_head.ray_node(_head(), tmp_path / "node.log", 1, {"node2": 1}, tmp_path):
            pass
    assert (tmp_path / "starts").read_text().count("x") == 2


def test_any_other_exit_fails_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(ray_head, "BIN", _fake_bin(tmp_path, "ValueError: bad --resources"))
    monkeypatch.setattr(ray_head, "POLL_S", 0.05)
    with pytest.raises(AssertionError, match="bad --resources"):
        with ray_head.ray_node(_head(), tmp_path / "node.log", 1, {"node2": 1}, tmp_path):
            pass
    assert (tmp_path / "starts").read_text().count("x") == 1
