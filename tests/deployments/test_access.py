"""Access rules of the OpenAI ingress (deployments.access, serve.* keys): a token that never prints and compares in
constant time, an error instead of an open ingress, and a public bind refused without a key."""

from __future__ import annotations

import pickle

import pytest

from configs import ConfigError, load_config
from configs.sections import is_loopback
from deployments.access import BearerToken, token_from_env

pytestmark = pytest.mark.unit


def test_the_token_admits_only_its_own_bearer_header_and_never_prints():
    token = BearerToken("s3cret")
    assert token.admits("Bearer s3cret")
    for header in (None, "", "s3cret", "Bearer s3cre", "Bearer s3cret ", "bearer s3cret", "Bearer S3CRET",
                   "Basic s3cret", "Bearer s3cretx"):
        assert not token.admits(header), header
    assert "s3cret" not in repr(token) and "s3cret" not in str(token) and "s3cret" not in f"{token!r} {[token]}"
    copy = pickle.loads(pickle.dumps(token))  # as Serve ships constructor arguments to the ingress replicas
    assert copy.admits("Bearer s3cret") and not copy.admits("Bearer other")
    with pytest.raises(ValueError, match="empty"):
        BearerToken("")


def test_a_named_but_unset_or_empty_variable_is_an_error_not_an_open_ingress(monkeypatch):
    assert token_from_env(None, "api_key_env") is None
    monkeypatch.delenv("TANDEM_ACCESS_TEST", raising=False)
    with pytest.raises(ValueError, match="api_key_env=TANDEM_ACCESS_TEST: the environment variable TANDEM_ACCESS_TEST"):
        token_from_env("TANDEM_ACCESS_TEST", "api_key_env")
    monkeypatch.setenv("TANDEM_ACCESS_TEST", "")
    with pytest.raises(ValueError, match="unset or empty"):
        token_from_env("TANDEM_ACCESS_TEST", "api_key_env")
    monkeypatch.setenv("TANDEM_ACCESS_TEST", "tok")
    assert token_from_env("TANDEM_ACCESS_TEST", "api_key_env").admits("Bearer tok")


def test_the_app_builder_refuses_an_unset_key_and_hands_a_set_one_to_the_ingress_as_an_argument(monkeypatch,
                                                                                                  tiny_model_dir):
    from deployments.rollout_app import RolloutAppArgs, build_app

    args = RolloutAppArgs(model=str(tiny_model_dir), api_key_env="TANDEM_ACCESS_TEST")
    monkeypatch.delenv("TANDEM_ACCESS_TEST", raising=False)
    with pytest.raises(ValueError, match="TANDEM_ACCESS_TEST is unset or empty"):
        build_app(args)
    monkeypatch.setenv("TANDEM_ACCESS_TEST", "tok-5c1d")
    ingress = build_app(args)._bound_deployment
    # not in the replica's runtime env, which the Ray dashboard and state API show
    assert "tok-5c1d" not in repr(ingress.ray_actor_options)
    [token] = [a for a in ingress.init_args if isinstance(a, BearerToken)]
    assert token.admits("Bearer tok-5c1d") and "tok-5c1d" not in repr(ingress.init_args)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_hosts_need_no_key(host):
    assert is_loopback(host)
    assert load_config(None, [f"serve.host={host}"]).serve.host == host


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "my-head-node"])
def test_a_public_bind_without_a_key_is_refused_unless_opted_out(host):
    assert not is_loopback(host) and not is_loopback("::")
    with pytest.raises(ConfigError, match="serve.api_key_env is unset") as error:
        load_config(None, [f"serve.host={host}"])
    assert "serve.allow_public_without_key=true" in str(error.value) and host in str(error.value)
    assert load_config(None, [f"serve.host={host}", "serve.api_key_env=MY_KEY"]).serve.api_key_env == "MY_KEY"
    assert load_config(None, [f"serve.host={host}", "serve.allow_public_without_key=true"]).serve.allow_public_without_key


def test_the_token_is_checked_before_the_body_is_validated(monkeypatch):
    """A request without the token learns nothing about the schema: 401, not a 400 naming the fields it got wrong."""
    from fastapi.testclient import TestClient

    from deployments import openai_ingress

    monkeypatch.setattr(openai_ingress, "_replica_token", lambda: BearerToken("tok-77"))
    client = TestClient(openai_ingress.app)  # no Serve replica behind it: only what runs before the handler answers
    for path in ("/v1/chat/completions", "/v1/completions"):
        for body in ({"messages": []}, {"prompt": 5, "n": 1000}, {}):
            response = client.post(path, json=body)
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key", response.text
    assert client.get("/v1/sessions/x").status_code == 401 and client.get("/v1/models").status_code == 401
