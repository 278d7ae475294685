"""Who may read through the history endpoint: SASL (PLAIN, SCRAM-SHA-512), as a Kafka broker does it.

TLS is the socket's (:mod:`rlm.listener.net.tls`). SASL runs inside the Kafka protocol, one :class:`SaslSession` per
connection (:meth:`SaslAuthenticator.session` is the server's ``session_factory``), on plaintext
(``SASL_PLAINTEXT``) or TLS (``SASL_SSL``) alike::

    HANDSHAKE     --SaslHandshake v1 (mechanism enabled)-->     AUTHENTICATE
    AUTHENTICATE  --SaslAuthenticate (PLAIN: 1 round; SCRAM: 2)--> AUTHENTICATED
    any state     --wrong credentials, bad token, unknown mechanism, unexpected request--> closed

Choices, each Kafka's own behaviour unless said:

- Before authentication only ApiVersions, SaslHandshake and SaslAuthenticate are read; any other request closes
  the connection without an answer (Kafka: ``IllegalSaslStateException``, connection closed), as does a request
  frame over :data:`MAX_PRE_AUTH_FRAME_BYTES` (Kafka's ``sasl.server.max.receive.size``).
- SaslHandshake at a version not offered (v2 and later) gets UNSUPPORTED_VERSION with the mechanisms, then closed.
- SaslHandshake v0 (after which a client would send bare SASL tokens without Kafka framing, as clients older than
  Kafka 1.0 do) is refused: UNSUPPORTED_VERSION with the mechanisms, then closed. librdkafka and the Java client
  use v1 and SaslAuthenticate whenever ApiVersions lists it, which it does here.
- A mechanism not enabled: UNSUPPORTED_SASL_MECHANISM with the enabled ones, then closed.
- Failed authentication: SASL_AUTHENTICATION_FAILED with a message that does not say whether the user exists,
  then closed, both after ``connection_failed_authentication_delay_ms`` (Kafka's
  ``connection.failed.authentication.delay.ms``, 100 ms). An unknown SCRAM user gets a salt stable per name, so
  the exchange looks like a wrong password.
- SCRAM user names: the client escapes ``,`` and ``=`` (RFC 5802's ``saslname``: ``=2C``, ``=3D``); scramp
  unescapes them once, and that name is both the one whose credential is looked up and the principal.
- After authentication, SaslHandshake and SaslAuthenticate get ILLEGAL_SASL_STATE (no re-authentication, KIP-368:
  ``session_lifetime_ms`` is 0) and the connection stays open.

Credentials: SCRAM-SHA-512 needs the salted credential (salt, StoredKey, ServerKey, iterations) of RFC 5802, which
`scramp <https://github.com/tlocke/scramp>`_ (MIT; the SCRAM of pg8000) derives and checks, server side included;
no crypto is written here. Each password from the settings is turned into that credential once, at start; the
sessions hold only credentials. A PLAIN password is checked by deriving the credential again with the user's salt
and comparing StoredKeys with :func:`hmac.compare_digest`. Passwords are SASLprep-normalized (RFC 4013) as
RFC 5802 asks; Kafka's clients do not normalize, which differs only for passwords with unusual Unicode
(non-ASCII spaces, soft hyphens...).
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import hmac
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from prometheus_client import Counter
from pydantic import SecretStr
from scramp import ScramException, ScramMechanism

from rlm.config import ConfigError, HistorySaslSettings
from rlm.listener.protocol.apis import SASL_API_KEYS, ApiKey, api_label
from rlm.listener.protocol.codec import ErrorCode, build, decode_request, encode_response, error_body, response_type
from rlm.listener.protocol.frame import BadRequestError, RequestHeader

__all__ = [
    "MAX_PRE_AUTH_FRAME_BYTES",
    "PLAIN",
    "SCRAM_SHA_512",
    "ScramCredentials",
    "SaslAuthenticator",
    "SaslSession",
]

log = logging.getLogger(__name__)

PLAIN = "PLAIN"
SCRAM_SHA_512 = "SCRAM-SHA-512"
SASL_HANDSHAKE_V1 = 1  # the first SaslHandshake version followed by SaslAuthenticate requests (KIP-152)
MAX_PRE_AUTH_FRAME_BYTES = 512 * 1024  # Kafka's sasl.server.max.receive.size default
FAILED_MESSAGE = "Authentication failed: invalid username or password"

AUTHENTICATIONS = Counter("rlm_history_authentications", "SASL authentications on the history endpoint",
                          ["mechanism", "result"])
REFUSED = Counter("rlm_history_unauthenticated_requests",
                  "Connections closed for a request other than ApiVersions/SASL before authentication", ["api"])


# -------------------------------------------------------------------------------------------- credentials
@dataclass(frozen=True, slots=True)
class _Credential:
    """RFC 5802's salted credential: what a SCRAM server keeps instead of the password."""

    salt: bytes
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)
    iterations: int


class ScramCredentials:
    """SCRAM-SHA-512 credentials of the configured users, derived once from their passwords.

    ``lookup`` is scramp's ``auth_fn``: an unknown user gets a credential that no password matches, with a salt
    derived from the name by a key of this process, so asking twice gives the same salt as for a real user."""

    def __init__(self, users: Mapping[str, SecretStr], iterations: int = 4096) -> None:
        self._mechanism = ScramMechanism(SCRAM_SHA_512)
        self._users: dict[str, _Credential] = {}
        for name, password in users.items():
            try:
                salt, stored, server, i = self._mechanism.make_auth_info(password.get_secret_value(),
                                                                         iteration_count=iterations)
            except ScramException:  # (its message may quote the password's characters: not shown)
                raise ConfigError(f"history_listener.sasl.users.{name}: the password cannot be used for SCRAM: "
                                  "RFC 4013 SASLprep refuses it (control, private-use or unassigned characters)"
                                  ) from None
            self._users[name] = _Credential(salt, stored, server, i)
        self._iterations = iterations
        self._unknown_key = secrets.token_bytes(32)
        # One key pair for unknown users: nobody knows a password that derives it.
        self._unknown_keys = (secrets.token_bytes(64), secrets.token_bytes(64))

    @property
    def mechanism(self) -> ScramMechanism:
        return self._mechanism

    def __contains__(self, name: object) -> bool:
        return name in self._users

    def lookup(self, name: str) -> tuple[bytes, bytes, bytes, int]:
        """scramp's ``auth_fn``: (salt, stored key, server key, iterations) of user ``name``. scramp calls it with
        the name already unescaped (RFC 5802's ``saslname``: ``=2C`` is ``,`` and ``=3D`` is ``=``, once): it is
        used as is, and it is the name the session authenticates (one identity for the lookup and the
        principal)."""
        return self._credential(name)

    def _credential(self, name: str) -> tuple[bytes, bytes, bytes, int]:
        cred = self._users.get(name)
        if cred is None:
            salt = hmac.new(self._unknown_key, name.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
            return salt, *self._unknown_keys, self._iterations
        return cred.salt, cred.stored_key, cred.server_key, cred.iterations

    def check_plain(self, name: str, password: str) -> bool:
        """Whether ``password`` is ``name``'s: its credential derived again with the user's salt matches (compared
        in constant time). Costs the PBKDF2 rounds, for unknown users too."""
        salt, stored, _server, iterations = self._credential(name)
        try:
            _salt, derived, _server_key, _i = self._mechanism.make_auth_info(password, iteration_count=iterations,
                                                                              salt=salt)
        except ScramException:
            return False  # SASLprep refuses the password: it cannot be any user's
        return hmac.compare_digest(derived, stored) and name in self._users


# --------------------------------------------------------------------------------------------------- SASL
class SaslAuthenticator:
    """What every connection of one listener shares: the enabled mechanisms and the users' credentials.
    :meth:`session` is the :class:`~rlm.listener.net.server.ListenerServer`'s ``session_factory``."""

    def __init__(self, settings: HistorySaslSettings, *, failed_authentication_delay_s: float = 0.1) -> None:
        self.mechanisms: tuple[str, ...] = tuple(settings.mechanisms)
        self.credentials = ScramCredentials(settings.users, settings.scram_iterations)
        self.failed_authentication_delay_s = failed_authentication_delay_s

    def session(self, peer: Any = None) -> SaslSession:
        return SaslSession(self, peer)


class State(enum.Enum):
    HANDSHAKE = "handshake"  # waiting for SaslHandshake
    AUTHENTICATE = "authenticate"  # mechanism chosen, waiting for SaslAuthenticate
    AUTHENTICATED = "authenticated"
    CLOSED = "closed"  # refused: the connection is closed after the response in flight


class SaslSession:
    """One connection's SASL state. The server awaits :meth:`gate` before serving each request; ``None`` lets the
    request through, bytes are the response sent instead (then the connection closes when
    ``close_after_response`` is set), ``b""`` closes the connection without an answer."""

    def __init__(self, authenticator: SaslAuthenticator, peer: Any = None) -> None:
        self.authenticator = authenticator
        self.peer = peer
        self.state = State.HANDSHAKE
        self.mechanism: str | None = None
        self.principal: str | None = None
        self._scram: Any = None  # scramp's ScramServer during a SCRAM exchange
        self._claimed_user: str | None = None

    @property
    def authenticated(self) -> bool:
        return self.state is State.AUTHENTICATED

    @property
    def close_after_response(self) -> bool:
        return self.state is State.CLOSED

    @property
    def max_frame_bytes(self) -> int | None:
        """The largest request frame read in this state (``None``: the server's own limit)."""
        return None if self.authenticated else MAX_PRE_AUTH_FRAME_BYTES

    async def gate(self, _server: Any, header: RequestHeader, frame: bytes) -> bytes | None:
        key = header.api_key
        sasl_api = key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)
        if self.state is State.AUTHENTICATED:
            if sasl_api and _offered(header):
                return _error(header, ErrorCode.illegal_sasl_state,
                              "already authenticated: re-authentication is not supported")
            return None
        if key == ApiKey.API_VERSIONS and self.state is State.HANDSHAKE:
            return None
        if key == ApiKey.SASL_HANDSHAKE and self.state is State.HANDSHAKE:
            return self._handshake(header, frame)
        if key == ApiKey.SASL_AUTHENTICATE and self.state is State.AUTHENTICATE:
            return await self._authenticate(header, frame)
        REFUSED.labels(api_label(key)).inc()  # a closed set: no label per attacker-chosen key
        log.warning("history endpoint: request before SASL authentication, connection closed",
                    extra={"peer": str(self.peer), "api_key": key, "api_version": header.api_version,
                           "state": self.state.value})
        self.state = State.CLOSED
        return b""

    # ------------------------------------------------------------------------------------------- steps
    def _handshake(self, header: RequestHeader, frame: bytes) -> bytes:
        enabled = list(self.authenticator.mechanisms)
        if not _offered(header) or header.api_version < SASL_HANDSHAKE_V1:
            self.state = State.CLOSED
            log.warning("history endpoint: SaslHandshake version refused (v1 with SaslAuthenticate is required)",
                        extra={"peer": str(self.peer), "api_version": header.api_version})
            if response_type(header) is None:
                # A version past the ones kio knows: answered with v1's body (every SaslHandshake version so far
                # starts with error_code, then the mechanisms) and a v0 response header, as Kafka answers an
                # ApiVersions it does not know at v0 so that any client can read it.
                header = header._replace(api_version=SASL_HANDSHAKE_V1, flexible=False)
            return _response(header, {"error_code": ErrorCode.unsupported_version, "mechanisms": enabled})
        req = self._decode(header, frame)
        if req is None:
            return b""
        if req.mechanism not in enabled:
            self.state = State.CLOSED
            log.warning("history endpoint: SASL mechanism not enabled", extra={
                "peer": str(self.peer), "mechanism": req.mechanism, "enabled": enabled})
            return _response(header, {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": enabled})
        self.mechanism = req.mechanism
        self.state = State.AUTHENTICATE
        return _response(header, {"error_code": ErrorCode.none, "mechanisms": enabled})

    async def _authenticate(self, header: RequestHeader, frame: bytes) -> bytes:
        if not _offered(header):
            self.state = State.CLOSED
            return _error(header, ErrorCode.unsupported_version, None)
        req = self._decode(header, frame)
        if req is None:
            return b""
        token = bytes(req.auth_bytes)
        if self.mechanism == PLAIN:
            user = await asyncio.to_thread(self._plain, token)
            answer = self._done(header, user, b"")
        else:
            answer = self._scram_step(header, token)
        if self.state is State.CLOSED and self.authenticator.failed_authentication_delay_s > 0:
            # Kafka's connection.failed.authentication.delay.ms: the failure is answered (and the connection
            # closed) later, so that guessing passwords costs the guesser time.
            await asyncio.sleep(self.authenticator.failed_authentication_delay_s)
        return answer

    def _plain(self, token: bytes) -> str | None:
        """RFC 4616: ``[authzid] NUL authcid NUL passwd``; the user's name if the password is theirs. An authzid,
        if given, must be the user itself (Kafka's rule: no impersonation)."""
        parts = token.split(b"\0")
        if len(parts) != 3:
            return None
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            return None
        self._claimed_user = user  # for the log line
        if not user or (authzid and authzid != user):
            return None
        return user if self.authenticator.credentials.check_plain(user, password) else None

    def _scram_step(self, header: RequestHeader, token: bytes) -> bytes:
        creds = self.authenticator.credentials
        try:
            message = token.decode("utf-8")
            if self._scram is None:  # client-first -> server-first
                self._scram = creds.mechanism.make_server(self._lookup)
                self._scram.set_client_first(message)
                return _response(header, {"error_code": ErrorCode.none, "error_message": None,
                                          "auth_bytes": self._scram.get_server_first().encode(),
                                          "session_lifetime": timedelta(0)})
            self._scram.set_client_final(message)  # client-final: the proof -> server-final
            final = self._scram.get_server_final().encode()
        except (ScramException, UnicodeDecodeError, ValueError, KeyError) as err:
            log.debug("history endpoint: SCRAM exchange failed", extra={"peer": str(self.peer), "error": str(err)})
            return self._done(header, None, b"")
        user = self._claimed_user if self._claimed_user in creds else None
        return self._done(header, user, final)

    def _lookup(self, name: str) -> tuple[bytes, bytes, bytes, int]:
        """scramp's ``auth_fn`` for this exchange: the name it looks up (unescaped once, by scramp) is the one the
        session authenticates, if the proof is right."""
        self._claimed_user = name
        return self.authenticator.credentials.lookup(name)

    def _done(self, header: RequestHeader, user: str | None, auth_bytes: bytes) -> bytes:
        mechanism = self.mechanism or "?"
        self._scram = None
        if user is None:
            AUTHENTICATIONS.labels(mechanism, "failed").inc()
            log.warning("history endpoint: SASL authentication failed, connection closed", extra={
                "peer": str(self.peer), "mechanism": mechanism, "user": self._claimed_user})
            self.state = State.CLOSED
            return _error(header, ErrorCode.sasl_authentication_failed, FAILED_MESSAGE)
        AUTHENTICATIONS.labels(mechanism, "ok").inc()
        log.info("history endpoint: client authenticated", extra={
            "peer": str(self.peer), "mechanism": mechanism, "user": user})
        self.principal = user
        self.state = State.AUTHENTICATED
        return _response(header, {"error_code": ErrorCode.none, "error_message": None, "auth_bytes": auth_bytes,
                                  "session_lifetime": timedelta(0)})

    def _decode(self, header: RequestHeader, frame: bytes) -> Any:
        try:
            return decode_request(frame, header)
        except BadRequestError as err:
            log.warning("history endpoint: SASL request does not decode, connection closed",
                        extra={"peer": str(self.peer), "error": str(err)})
            self.state = State.CLOSED
            return None


def _offered(header: RequestHeader) -> bool:
    lo_hi = SASL_API_KEYS.get(header.api_key)
    return lo_hi is not None and lo_hi[0] <= header.api_version <= lo_hi[1]


def _response(header: RequestHeader, values: dict[str, Any]) -> bytes:
    """``header``'s response (an offered SASL version: kio has its schema) with ``values``."""
    return encode_response(header, build(response_type(header), values))


def _error(header: RequestHeader, code: ErrorCode, message: str | None) -> bytes:
    rtype = response_type(header)
    if rtype is None:  # a version kio does not know
        return encode_response(header, None, raw_error=code.value)
    if message is not None and any(f.name == "error_message" for f in fields(rtype)):
        return encode_response(header, build(rtype, {"error_code": code, "error_message": message}))
    return encode_response(header, error_body(rtype, code))
