"""``make bench``'s table takes each benchmark's own verdict from its last line; it never decides one."""

import pytest

from benchmarks.run_all import benchmarks, goal_of, summarize, table

pytestmark = pytest.mark.unit


def test_rows_come_from_the_last_line_and_the_modules_goal():
    row = summarize("stream_vs_sync", ["noise 9.99x\n", "stream/sync trained tokens/s: 1.43x (long share trained 9% "
                                       "vs generated 10%) FAIL\n", "\n"], 0, 12.3)
    assert (row["ratio"], row["verdict"], row["time"]) == ("1.43x", "FAIL", "12s")
    assert row["goal"].startswith("stream/sync trained tokens/s >= 2.0x")
    assert summarize("routing", ["sticky share 1.000\n"], 0, 1.0)["verdict"] == "-"
    fuzz = summarize("fuzz_api", ["fuzz-api: 2000 requests; 5xx 0, off-schema 0; PASS (0 answers 5xx)\n"], 0, 1.0)
    assert fuzz["ratio"] == "-" and fuzz["verdict"] == "PASS"  # "5xx" holds no ratio
    assert summarize("routing", ["Traceback ...\n"], 1, 1.0)["verdict"] == "ERROR"
    assert goal_of("routing") == "-"


def test_every_benchmark_with_a_goal_prints_a_computed_verdict():
    names = benchmarks()
    assert {"stream_vs_sync", "rollout_async", "learning_control"} <= set(names) and "run_all" not in names
    for name in ("stream_vs_sync", "rollout_async", "learning_control"):
        assert goal_of(name) != "-"
    text = table([summarize("a", ["x 2.00x PASS"], 0, 1.0), summarize("b", [""], 0, 1.0)])
    assert text.splitlines()[0].split() == ["benchmark", "ratio", "goal", "verdict", "time"]
    assert "PASS" in text.splitlines()[1]


def test_chaos_verdict_of_a_job_with_two_faults_needs_both_goals():
    from benchmarks.chaos import Outcome

    def outcome(**kw):
        base = dict(fault="train_worker+sigint", codes=[130, 0], steps=4, total_steps=4, versions=[1, 2, 4, 5],
                    checkpoint=True, resumed_from=3, injected=True)
        return Outcome(**{**base, **kw})

    ok, goal = outcome().verdict()
    assert ok and "strictly increasing" in goal and "resumed" in goal
    assert not outcome(versions=[1, 2, 2, 3]).verdict()[0]  # the train worker's goal
    assert not outcome(resumed_from=0).verdict()[0]  # Ctrl-C's goal
    assert not outcome(codes=[0]).verdict()[0]  # a job that was never interrupted
    assert not outcome(injected=False).verdict()[0]
    assert not outcome(steps=3).verdict()[0]
    assert Outcome("train_worker", codes=[0], steps=4, total_steps=4, versions=[1, 2, 3], injected=True).verdict()[0]
    assert not Outcome("replica", codes=[0], steps=4, total_steps=4, failed=1, injected=True).verdict()[0]
    assert Outcome("over_asked", codes=[2], wall_s=20.0, output="2.1 CPUs asked").verdict()[0]
