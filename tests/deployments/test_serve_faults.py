"""benchmarks.serve_faults' checks, on made-up answers: a session record must hold exactly its answered requests'
tokens in order; an error body must be OpenAI's error object to count as a clean 503."""

from __future__ import annotations

import httpx
import pytest

from benchmarks.serve_faults import Record, _error_outcome, check_sessions

pytestmark = pytest.mark.unit


def _store(sessions: dict[str, list[dict]]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        session = request.url.path.rsplit("/", 1)[-1]
        if session not in sessions:
            return httpx.Response(404, json={"error": {"message": "no calls", "type": "invalid_request_error"}})
        return httpx.Response(200, json={"session_id": session, "calls": sessions[session]})
    return httpx.MockTransport(answer)


def _call(prompt, answer):
    return {"prompt_ids": prompt, "response_ids": answer, "logprobs": [], "policy_version": 0, "finish_reason": "stop"}


def test_session_records_match_only_the_answered_requests_in_order():
    records = [Record("a", 1, 0.0, 1.0, "200", ([1, 2, 9], [4])), Record("a", 0, 0.0, 1.0, "200", ([1, 2], [9])),
               Record("b", 0, 0.0, 1.0, "HTTP 503"),  # never answered: no record
               Record("c", 0, 0.0, 1.0, "200", ([7], [8])), Record("c", 1, 0.0, 1.0, "HTTP 503")]
    store = {"a": [_call([1, 2], [9]), _call([1, 2, 9], [4])], "c": [_call([7], [8])]}
    assert check_sessions("http://x", "t", records, transport=_store(store)) == (3, [])


@pytest.mark.parametrize("store, said", [
    ({"a": [_call([1, 2], [9])], "b": [_call([5], [6])]}, "b: no request answered, but the record answers 200"),
    ({}, "a: 1 answered, the record answers 404"),
    ({"a": [_call([1, 2], [9]), _call([1, 2], [9])]}, "a: 1 answered, the record holds 2 calls that differ"),
    ({"a": [_call([1, 2], [3])]}, "a: 1 answered, the record holds 1 calls that differ"),
])
def test_a_session_record_that_differs_from_its_requests_is_reported(store, said):
    records = [Record("a", 0, 0.0, 1.0, "200", ([1, 2], [9])), Record("b", 0, 0.0, 1.0, "timeout")]
    assert check_sessions("http://x", "t", records, transport=_store(store))[1] == [said]


def test_only_openais_error_object_counts_as_a_clean_error():
    shaped = httpx.Response(503, json={"error": {"message": "request x: its replica died", "type": "server_error"}})
    assert _error_outcome(shaped) == "HTTP 503"
    assert _error_outcome(httpx.Response(503, text="upstream connect error")) == "HTTP 503 not OpenAI-shaped"
    assert _error_outcome(httpx.Response(500, json={"detail": "boom"})) == "HTTP 500 not OpenAI-shaped"
