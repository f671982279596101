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
    # up to 100 per route: hypothesis stops early on a route whose inputs it has exhausted (GET /v1/models has one header)
    assert 300 <= report.requests <= 400 and len(report.by_route) == 4, report.summary()
    # the generated requests reached the handlers too: not only validation errors and 401s
    assert report.by_status[200] > 0 and report.by_status[400] > 0 and report.by_status[401] > 0, report.summary()
