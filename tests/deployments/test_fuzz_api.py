"""Generated hostile input against the shared app's OpenAI ingress (``benchmarks.fuzz_api.fuzz``, a fixed seed and a
few hundred requests; ``make fuzz-api`` sends 2,000 with a new seed): no 5xx, every answer on its schema, the server
healthy after and a valid session's record untouched."""

from __future__ import annotations

import pytest

from benchmarks.fuzz_api import fuzz

pytestmark = pytest.mark.integration


def test_generated_requests_get_no_5xx_and_answers_on_the_schema(rollout_app):
    report = fuzz(rollout_app.base_url.removesuffix("/v1"), rollout_app.api_key, requests=400, seed=20261205,
                  time_limit_s=300)
    print(report.summary())
    problems = report.server_errors + report.schema_errors + report.transport_errors
    assert not problems, "\n".join(problems[:10])
    assert report.healthy_after and report.session_intact, report.summary()
    # every route of the schema: /health, /v1/{chat/completions,completions,models,sessions/{id}} and the three under
    # Agent Lightning 0.3.x's /rollout/{rollout_id}/attempt/{attempt_id} prefix
    assert report.requests == 400 and len(report.by_route) == 8, report.summary()
    # the generated requests reached the handlers too: not only validation errors and 401s
    assert report.by_status[200] > 0 and report.by_status[400] > 0 and report.by_status[401] > 0, report.summary()


# Regression tests of what the fuzzer found (seed, route, body as it sent them).

def test_a_seed_beyond_64_bits_is_a_400_naming_it_not_a_500(rollout_app):
    """make fuzz-api, seed 488811149: POST /v1/completions with seed -5.7e31 ended in a 500 from the engine."""
    import httpx

    body = {"else": {}, "prompt": "»²", "stream": True, "stop": None, "echo": False,
            "seed": -57324355234481864248922310967296, "suffix": None}
    for seed in (-57324355234481864248922310967296, -1, 2**63):
        response = httpx.post(f"{rollout_app.base_url}/completions", json={**body, "seed": seed},
                              headers={"Authorization": f"Bearer {rollout_app.api_key}"}, timeout=60)
        assert response.status_code == 400 and "seed" in response.json()["error"]["message"], (seed, response.text)
    ok = httpx.post(f"{rollout_app.base_url}/completions", json={"prompt": "»²", "seed": 2**62, "max_tokens": 2},
                    headers={"Authorization": f"Bearer {rollout_app.api_key}"}, timeout=60)
    assert ok.status_code == 200, ok.text
