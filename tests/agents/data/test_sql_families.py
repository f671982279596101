"""The SQL question families: every family answerable on the real databases, the held-out split rule, draws
that depend on the seed only, and the validation groups they report under."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from agents.data.chinook_db import build_chinook_db
from agents.data.insurance_db import build_insurance_db
from agents.data.sql_families import (FAMILIES, SHAPES, answerable, draw, heldout_families, quote, render,
                                      slot_values, train_families)
from agents.data.sql_tasks import HELDOUT_GROUP, SAME_GROUP, TRAIN_GROUP, family_splits
from agents.records import ScoredSample
from orchestration.validation import ValidationResult, validation_metrics

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def dbs(tmp_path_factory) -> dict[str, Path]:
    from apps.prepare_sql import default_cache_dir, download_chinook_sdist, extract_fixture

    out = tmp_path_factory.mktemp("dbs")
    cache = default_cache_dir()
    return {"insurance": build_insurance_db(out / "insurance.sqlite", seed=0),
            "chinook": build_chinook_db(extract_fixture(download_chinook_sdist(cache), cache), out / "chinook.sqlite")}


def test_the_split_rule_holds_out_whole_families_of_every_shape_and_both_databases():
    held, trained = heldout_families(), train_families()
    assert {f.name for f in held}.isdisjoint(f.name for f in trained)
    assert len(held) + len(trained) == len(FAMILIES) == 2 * len(SHAPES)
    assert {f.shape for f in held} == {f.shape for f in trained} == set(SHAPES)
    assert Counter(f.db_id for f in held) == {"chinook": 6, "insurance": 5}
    assert len({f.question for f in FAMILIES}) == len(FAMILIES)  # no template shared between families


def test_every_family_has_answerable_questions_whose_gold_runs(dbs):
    for family in FAMILIES:
        conn = sqlite3.connect(dbs[family.db_id])
        pool = [render(family, slots) for slots in slot_values(family, conn)]
        answered = [q for q in pool[:40] if answerable(conn, q.sql)]
        assert len(answered) >= 3, family.name
        for q in answered[:3]:
            rows = conn.execute(q.sql).fetchall()
            assert rows and not (len(rows) == 1 and rows[0] in ((0,), (None,))), (family.name, q.sql)
            assert "{" not in q.question and "{" not in q.sql, family.name


def test_text_slots_are_quoted_as_sql_literals():
    assert quote("Guns N' Roses") == "'Guns N'' Roses'"
    assert quote(3) == "3"


def test_splits_are_fixed_by_the_seed_and_keep_held_out_questions_out_of_training(dbs):
    a, b, c = family_splits(dbs, 0), family_splits(dbs, 0), family_splits(dbs, 1)
    assert a == b
    assert [r.extra_info.question for r in a["train"]] != [r.extra_info.question for r in c["train"]]
    train_q = {r.extra_info.question for r in a["train"]}
    assert train_q.isdisjoint(r.extra_info.question for r in a["val_same_family"])
    assert {r.extra_info.family for r in a["train"]} == {f.name for f in train_families()}
    assert {r.extra_info.family for r in a["val_heldout_family"]} == {f.name for f in heldout_families()}
    assert {r.data_source.partition(":")[0] for r in a["train"]} == {TRAIN_GROUP}
    assert {r.data_source.partition(":")[0] for r in a["val_same_family"]} == {SAME_GROUP}
    assert {r.data_source.partition(":")[0] for r in a["val_heldout_family"]} == {HELDOUT_GROUP}
    assert len(a["train"]) >= 10 * len(train_families())


def test_a_draw_never_repeats_a_question_and_skips_excluded_ones(dbs):
    import random

    family = FAMILIES[0]
    first = draw([family], dbs, 5, random.Random(3))
    again = draw([family], dbs, 5, random.Random(3), exclude={q.question for q in first})
    assert len({q.question for q in first}) == 5
    assert {q.question for q in first}.isdisjoint(q.question for q in again)


def test_validation_reports_each_family_and_its_group():
    samples = [ScoredSample(f"{HELDOUT_GROUP}:{fam}", f"u{fam}{i}", "q", "a", float(ok))
               for fam, oks in (("a", (1, 1)), ("b", (0, 0, 0, 1))) for i, ok in enumerate(oks)]
    metrics = validation_metrics(samples)
    assert metrics[f"val-core/{HELDOUT_GROUP}:a/reward/mean@1"] == 1.0
    assert metrics[f"val-core/{HELDOUT_GROUP}:b/reward/mean@1"] == 0.25
    assert metrics[f"val-core/{HELDOUT_GROUP}/reward/mean@1"] == pytest.approx(3 / 6)
    line = ValidationResult(0, metrics, samples, 1.0).summary()
    assert f"{HELDOUT_GROUP} 0.500" in line and ":a" not in line
