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
