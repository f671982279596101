"""SQL execution-match reward on a real SQLite file."""

from __future__ import annotations

import pytest

from agents.rewards import compute_reward, reward_fn, sql as sql_reward
from agents.rewards.sql import extract_sql, has_top_level_order_by, results_match, score
from agents.tools.sql import SqlResult
from tests.agents.tools.shop_db import build_shop_db


@pytest.fixture
def db(tmp_path):
    return build_shop_db(tmp_path / "shop.sqlite")


@pytest.mark.unit
def test_same_rows_any_order_without_gold_order_by(db):
    gold = "SELECT name FROM customers WHERE city = 'London'"
    assert score("SELECT name FROM customers WHERE city = 'London' ORDER BY name DESC", gold, db_path=db) == 1.0
    assert score("SELECT name FROM customers WHERE id IN (1, 3)", gold, db_path=db) == 1.0
    assert score("SELECT name FROM customers", gold, db_path=db) == 0.0


@pytest.mark.unit
def test_order_matters_when_gold_orders(db):
    gold = "SELECT name FROM customers ORDER BY name"
    assert score("SELECT name FROM customers ORDER BY id", gold, db_path=db) == 1.0  # Ada, Bo, Cy either way
    assert score("SELECT name FROM customers ORDER BY name DESC", gold, db_path=db) == 0.0


@pytest.mark.unit
def test_multiset_counts_duplicates(db):
    gold = "SELECT city FROM customers"  # London, Paris, London
    assert score("SELECT DISTINCT city FROM customers", gold, db_path=db) == 0.0
    assert score("SELECT city FROM customers ORDER BY city", gold, db_path=db) == 1.0


@pytest.mark.unit
def test_float_tolerance_and_int_float_equality(db):
    # total of orders is 27.0; 27.0000000001 is within 1e-6 relative, 27.1 is not; SUM over ints vs 27.0.
    gold = "SELECT sum(amount) FROM orders"
    assert score("SELECT 27.0000000001", gold, db_path=db) == 1.0
    assert score("SELECT 27.1", gold, db_path=db) == 0.0
    assert score("SELECT 27", gold, db_path=db) == 1.0


@pytest.mark.unit
def test_prediction_errors_and_attacks_score_zero(db):
    gold = "SELECT count(*) FROM customers"
    assert score("SELECT count(*) FROM nope", gold, db_path=db) == 0.0
    assert score("DROP TABLE customers", gold, db_path=db) == 0.0
    assert score("", gold, db_path=db) == 0.0
    assert score("SELECT count(*) FROM customers", gold, db_path=db) == 1.0  # the table survived


@pytest.mark.unit
def test_prediction_with_too_many_rows_scores_zero(db):
    assert score("SELECT x FROM numbers", "SELECT x FROM numbers WHERE x <= 3", db_path=db, max_rows=5) == 0.0


@pytest.mark.unit
def test_bad_gold_raises(db):
    with pytest.raises(ValueError, match="gold SQL failed"):
        score("SELECT 1", "SELECT * FROM nope", db_path=db)
    with pytest.raises(ValueError, match="exceeds max_rows=5"):
        score("SELECT 1", "SELECT x FROM numbers", db_path=db, max_rows=5)


@pytest.mark.unit
def test_fenced_model_answer(db):
    answer = "Try:\n```sql\nSELECT 1\n```\nFinal:\n```sql\nSELECT name FROM customers WHERE id = 2\n```"
    assert extract_sql(answer) == "SELECT name FROM customers WHERE id = 2"
    assert score(answer, "SELECT 'Bo'", db_path=db) == 1.0
    assert extract_sql("```\nSELECT 2\n```") == "SELECT 2"
    assert extract_sql("  SELECT 3 ") == "SELECT 3"


@pytest.mark.unit
@pytest.mark.parametrize(
    "query,expected",
    [
        ("SELECT a FROM t ORDER BY a", True),
        ("select a from t order\n  by a limit 3", True),
        ("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1", True),
        ("SELECT a FROM (SELECT a FROM t ORDER BY a)", False),
        ("SELECT row_number() OVER (ORDER BY a) FROM t", False),
        ("WITH x AS (SELECT a FROM t ORDER BY a) SELECT * FROM x", False),
        ("SELECT 'ORDER BY' FROM t", False),
        ('SELECT "order by" FROM t -- ORDER BY a', False),
        ("SELECT a FROM t /* ORDER BY */ WHERE a > 1", False),
    ],
)
def test_has_top_level_order_by(query, expected):
    assert has_top_level_order_by(query) is expected


@pytest.mark.unit
def test_results_match_tolerant_slow_path():
    # 1.0000000004 and 0.9999999996 round apart at 9 digits but are within tolerance of 1.0.
    gold = SqlResult(columns=("a", "b"), rows=((1.0000000004, "x"), (2.0, "y")))
    pred = SqlResult(columns=("p", "q"), rows=((2.0, "y"), (0.9999999996, "x")))
    assert results_match(gold, pred, ordered=False)
    assert not results_match(gold, pred, ordered=True)
    assert not results_match(gold, SqlResult(columns=("a",), rows=((1.0,), (2.0,))), ordered=False)
    assert not results_match(gold, SqlResult(columns=("a", "b"), rows=((1.0, "x"), (2.0, 2))), ordered=False)


@pytest.mark.unit
def test_reward_table_dispatch(db):
    assert reward_fn("openai/gsm8k") is reward_fn("gsm8k_train")
    assert reward_fn("spider/dev") is sql_reward.score
    assert reward_fn("reasoning_gym/gsm_symbolic") is reward_fn("openai/gsm8k")
    with pytest.raises(KeyError, match="no reward for data_source 'math'"):
        reward_fn("math")
    extra = {"db_path": str(db), "split": "train", "index": 7}
    assert compute_reward("sql/shop", "SELECT count(*) FROM orders", "SELECT 5", extra) == 1.0
    assert compute_reward("openai/gsm8k", "#### 5", "5", {"split": "test"}) == 1.0
    assert compute_reward("tandem/arithmetic", "The answer is 12.", "12", {"split": "test"}) == 1.0


@pytest.mark.unit
def test_shipped_insurance_gold_queries_pass_the_guards_and_match_themselves(tmp_path):
    # Every gold query of the synthetic insurance task must run under the hardened connection
    # (allow-listed functions only) and score 1.0 against itself.
    from agents.data.insurance_db import build_insurance_db
    from agents.data.sql_questions import QUESTIONS

    db = build_insurance_db(tmp_path / "insurance.sqlite", seed=0)
    for question, gold in QUESTIONS["insurance"]:
        assert score(f"```sql\n{gold}\n```", gold, db_path=db) == 1.0, question
