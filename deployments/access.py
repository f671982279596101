"""Bearer-token access to the OpenAI ingress (deployments layer).

The token is read once, where the app is built (the driver's or ``serve deploy``'s process), and travels to the
ingress replicas as a constructor argument: never as a runtime-env variable, which the Ray dashboard and state API
show to anyone who can read them. ``BearerToken`` never prints its value (``repr``, logs, tracebacks) and compares
in constant time.
"""

from __future__ import annotations

import hmac
import os

from configs import ConfigError


class BearerToken:
    """The one token the ingress accepts, as ``Authorization: Bearer <token>``."""

    __slots__ = ("_expected",)

    def __init__(self, value: str):
        if not value:
            raise ValueError("an empty bearer token would admit every request")
        self._expected = f"Bearer {value}".encode()

    def admits(self, authorization: str | None) -> bool:
        """True when the request's ``Authorization`` header carries the token (constant-time comparison)."""
        return hmac.compare_digest((authorization or "").encode(), self._expected)

    def secret(self) -> str:
        """The token itself, for the project's own clients of the ingress (agent workers' HTTP agent loops)."""
        return self._expected.decode().removeprefix("Bearer ")

    def __repr__(self) -> str:
        return "BearerToken(<hidden>)"

    __str__ = __repr__

    def __getstate__(self) -> bytes:
        return self._expected

    def __setstate__(self, state: bytes) -> None:
        self._expected = state


def token_from_env(env_name: str | None, key: str) -> BearerToken | None:
    """The token in environment variable ``env_name`` (``None`` when no variable is named: the ingress is open).
    A variable that is named but unset or empty is a ``ConfigError`` naming ``key`` (the CLIs print it as one line):
    the app would otherwise start open."""
    if not env_name:
        return None
    value = os.environ.get(env_name, "")
    if not value:
        raise ConfigError(f"{key}={env_name}: the environment variable {env_name} is unset or empty in this process, so "
                         f"the OpenAI ingress would accept every request. Export it before deploying "
                         f"(export {env_name}=<token>), or remove {key} to serve without a token")
    return BearerToken(value)
