"""Which librdkafka properties hold secrets, and the two shapes a client configuration with secrets takes.

- In the settings (``kafka.client``) and the Spark source's options, a secret property's value is a
  :class:`~pydantic.SecretStr`: repr, str, ``model_dump`` and log lines show ``**********``.
- :func:`reveal_client_config` unwraps them for the one place that needs the value, the confluent-kafka client,
  and :class:`RedactedConfig` is what such a revealed configuration is handed around as (the metadata manager's
  config, the Spark options): a plain ``dict`` for the clients (``{**conf}``, ``dict(conf)``), whose repr hides
  the secret values (a dataclass holding it prints ``'sasl.password': '**********'``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import SecretStr

__all__ = ["MASK", "RedactedConfig", "is_secret_client_property", "redacted", "reveal_client_config"]

MASK = "**********"  # what pydantic's SecretStr shows

# Passwords (sasl.password, ssl.key.password, ssl.keystore.password ...), secrets (sasl.oauthbearer.client.secret),
# private keys given inline (ssl.key.pem, ssl_key) and the OAuth bearer config (it may hold a token).
_SECRET = re.compile(r"(?i)password|secret|^ssl\.key\.pem$|^ssl_key$|^sasl\.oauthbearer\.config$")


def is_secret_client_property(name: str) -> bool:
    """Whether the librdkafka property ``name`` holds a secret (``sasl.password``, ``ssl.key.password`` ...)."""
    return _SECRET.search(name) is not None


def reveal_client_config(client: Mapping[str, Any]) -> dict[str, Any]:
    """``client`` with every :class:`~pydantic.SecretStr` value unwrapped: for a confluent-kafka client only."""
    return {k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in client.items()}


def redacted(client: Mapping[str, Any]) -> dict[str, Any]:
    """``client`` with the value of every secret property replaced by :data:`MASK` (for messages and logs)."""
    return {k: MASK if is_secret_client_property(k) or isinstance(v, SecretStr) else v for k, v in client.items()}


class RedactedConfig(dict):
    """A client configuration (secrets revealed, as librdkafka needs them) whose repr and str mask them."""

    def __repr__(self) -> str:
        return repr(redacted(self))

    __str__ = __repr__
