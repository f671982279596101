"""benchmarks.serve_load's arithmetic on made-up records: a level's figures count the requests that ended in its
window and the in-window share of those cut by its end; the engine profile is the counters' change over a level."""

from __future__ import annotations

import pytest

from benchmarks.serve_load import engine_profile, parse_vllm_metrics, summarize, vllm_profile

pytestmark = pytest.mark.unit


def test_a_level_counts_finished_requests_and_the_share_of_one_cut_by_the_window():
    records = [{"start": 0.0, "latency_s": 4.0, "ttft_s": 1.0, "output_tokens": 40, "error": ""},
               {"start": 6.0, "latency_s": 8.0, "ttft_s": 2.0, "output_tokens": 80, "error": ""},  # half in the window
               {"start": 1.0, "latency_s": 1.0, "ttft_s": 1.0, "output_tokens": 0, "error": "HTTP 503"}]
    level = summarize("tandem", 8, 10.0, records)
    assert level.requests == 1 and level.output_tokens == 40 + 40
    assert level.tokens_per_s == pytest.approx(8.0) and level.requests_per_s == pytest.approx(0.1)
    assert dict(level.errors) == {"HTTP 503": 1}


def test_the_engine_profile_is_the_change_of_its_counters_over_the_level():
    before = {"steps": 100, "decode_s": 10.0, "decode_rows": 800, "decode_padding": 0, "prefill_s": 2.0,
              "prefill_tokens": 500, "prefill_tokens_cached": 0, "merge_s": 1.0, "generated_tokens": 900}
    after = {**before, "steps": 300, "decode_s": 50.0, "decode_rows": 800 + 200 * 16, "decode_padding": 6400,
             "prefill_s": 7.0, "prefill_tokens": 2500, "merge_s": 3.0, "generated_tokens": 900 + 3300}
    line = engine_profile(before, after, 60.0)
    assert "busy 47s of 60s" in line and "decode 40s in 200 steps, 200 ms/step, 16.0 rows/step" in line, line
    assert "2 padded cache positions/row" in line and "2000 tokens computed" in line and "3300 tokens generated" in line
    assert engine_profile({"error": "gone"}, after, 60.0) == "engine counters unreadable: gone"


def test_vllms_steps_come_from_its_prometheus_counters_summed_over_labels():
    text = """# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 3.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 50.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 1200.0
vllm:generation_tokens_total{engine="0",model_name="m"} 900.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 250.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 50.0
vllm:prompt_tokens_cached_total{engine="0",model_name="m"} 100.0
"""
    after = parse_vllm_metrics(text)
    assert after == {"steps": 50.0, "step_tokens": 1200.0, "generated_tokens": 900.0, "prompt_tokens": 300.0,
                     "prompt_tokens_cached": 100.0}
    line = vllm_profile(dict.fromkeys(after, 0.0), after, 10.0)
    assert "50 steps, 200 ms/step of wall, 18.0 tokens generated/step, 24.0 forwarded/step" in line, line


def test_a_decode_steps_operators_are_grouped_and_the_rest_is_time_outside_them():
    from benchmarks.decode_step_profile import shares

    out = shares({"aten::addmm": 500.0, "aten::mm": 100.0, "aten::cat": 100.0, "aten::add": 100.0}, 1000.0)
    assert out == pytest.approx({"matrix products": 0.6, "cat": 0.1, "other operators": 0.1,
                                 "outside operators": 0.2})
    assert list(out)[0] == "matrix products"  # largest first
    from benchmarks.decode_step_profile import top_others

    others = top_others({"aten::addmm": 500.0, "aten::mul": 50.0, "aten::add": 100.0}, 1000.0)
    assert others == "aten::add 10%, aten::mul 5%"  # the matrix product is not an "other" operator


def test_cpu_profile_splits_the_levels_cpu_seconds_by_role_counting_new_processes_whole():
    from benchmarks.serve_load import cpu_profile

    before = {10: ("ingress", 5.0), 11: ("rollout replica", 100.0), 12: ("other", 1.0)}
    after = {10: ("ingress", 25.0), 11: ("rollout replica", 250.0), 13: ("load generator", 30.0),
             14: ("ingress", 0.2)}  # 12 ended during the level (missed); 14 used too little to be named
    line = cpu_profile(before, after, 100.0)
    assert "rollout replica 150s, load generator 30s, ingress 20s" in line and "other" not in line
    assert line.startswith("cpu: 200s used of ")
