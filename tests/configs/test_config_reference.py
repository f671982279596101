"""The configuration reference is complete: every key of the schema carries a description (the attribute docstring
under its field), and the page ``make docs`` generates (``scripts/gen_docs.py``) lists every key with its status."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_docs = _gen_docs()


def test_every_key_has_a_description():
    missing = [key for key, _, cls, info in gen_docs.fields() if not (info.description or "").strip()]
    assert not missing, (f"config keys without a description (add a docstring under the field in configs/*.py): "
                         f"{', '.join(missing)}")


def test_the_reference_lists_every_key_with_its_status():
    page = gen_docs.config_reference()
    rows = {line.split("|")[1].strip().strip("`"): line for line in page.splitlines() if line.startswith("| `")}
    keys = [key for key, *_ in gen_docs.fields()]
    assert len(keys) > 200  # the walk reached the nested sections
    assert [k for k in keys if k not in rows] == []
    assert "rejected unless default" in rows["data.prompt_key"]
    assert "warned (no effect)" in rows["algorithm.gamma"]
    assert "implemented" in rows["stream.max_staleness"]


def test_the_reference_lists_the_verl_keys_each_section_ignores():
    page = gen_docs.config_reference()
    for path, cls in gen_docs.sections():
        prefix = f"{path}." if path else ""
        for key in cls.VERL_UNIMPLEMENTED:
            assert f"`{prefix}{key}`" in page, f"{prefix}{key} (VERL_UNIMPLEMENTED) is not on the page"


def test_the_benchmarks_page_shows_the_last_trl_table_when_there_is_one(tmp_path, monkeypatch):
    report = tmp_path / "report.txt"
    monkeypatch.setattr(gen_docs, "PEERS_REPORT", report)
    assert "## Side by side with TRL" not in gen_docs.benchmarks_page(tmp_path / "absent.json")
    report.write_text("peer_trl: time to held-out ≥ 0.9 1.50x (with start-up), ...; FAIL (goal)\n")
    page = gen_docs.benchmarks_page(tmp_path / "absent.json")
    assert "## Side by side with TRL" in page and "peer_trl: time to held-out ≥ 0.9 1.50x" in page
