"""Who may read through the listener: SASL (PLAIN, SCRAM-SHA-512), as a Kafka broker does it; as a proxy, SASL passed
through to the broker (:class:`SaslPassThrough`: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), which authenticates each client.

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
import dataclasses
import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from prometheus_client import Counter
from pydantic import SecretStr
from scramp import ScramException, ScramMechanism

from rlm.config import ConfigError, HistorySaslSettings
from rlm.listener.net.principals import peer_host, user
from rlm.listener.protocol.apis import SASL_API_KEYS, ApiKey, api_label
from rlm.listener.protocol.codec import (
    ErrorCode,
    build,
    decode_request,
    decode_response,
    encode_response,
    error_body,
    response_type,
)
from rlm.listener.protocol.frame import SIZE, BadRequestError, RequestHeader
from rlm.listener.upstream.brokers import UpstreamError
from rlm.logs import limited_logger

__all__ = [
    "MAX_PRE_AUTH_FRAME_BYTES",
    "PLAIN",
    "SCRAM_SHA_256",
    "SCRAM_SHA_512",
    "PassThroughSession",
    "SaslAuthenticator",
    "SaslPassThrough",
    "SaslSession",
    "ScramCredentials",
    "plain_user",
    "scram_user",
]

log = limited_logger(__name__)

PLAIN = "PLAIN"
SCRAM_SHA_256 = "SCRAM-SHA-256"
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
        self.credentials = ScramCredentials(settings.users or {}, settings.scram_iterations)
        self.failed_authentication_delay_s = failed_authentication_delay_s

    def session(self, peer: Any = None, upstream: Any = None) -> SaslSession:  # noqa: ARG002 - the factory's shape
        return SaslSession(self, peer)


class State(enum.Enum):
    HANDSHAKE = "handshake"  # waiting for SaslHandshake
    AUTHENTICATE = "authenticate"  # mechanism chosen, waiting for SaslAuthenticate
    AUTHENTICATED = "authenticated"
    CLOSED = "closed"  # refused: the connection is closed after the response in flight


class _Gate:
    """What every connection's SASL session shares (:class:`SaslSession`, :class:`PassThroughSession`): its state, the
    gate the server awaits before serving each request, the pre-authentication frame bound and the SaslHandshake
    checks. :meth:`gate` returns ``None`` to let the request through, bytes to send instead (then the connection
    closes when ``close_after_response`` is set), ``b""`` to close the connection without an answer."""

    who = "history endpoint"  # log lines' prefix

    def __init__(self, mechanisms: tuple[str, ...], peer: Any) -> None:
        self.mechanisms = mechanisms
        self.peer = peer
        self.state = State.HANDSHAKE
        self.mechanism: str | None = None
        self.principal: str | None = None

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
            return await self._on_handshake(header, frame)
        if key == ApiKey.SASL_AUTHENTICATE and self.state is State.AUTHENTICATE:
            return await self._authenticate(header, frame)
        REFUSED.labels(api_label(key)).inc()  # a closed set: no label per attacker-chosen key
        log.warning(f"{self.who}: request before SASL authentication, connection closed",
                    extra={"peer": str(self.peer), "api_key": key, "api_version": header.api_version,
                           "state": self.state.value})
        self.state = State.CLOSED
        return b""

    async def _on_handshake(self, header: RequestHeader, frame: bytes) -> bytes:
        raise NotImplementedError

    async def _authenticate(self, header: RequestHeader, frame: bytes) -> bytes:
        raise NotImplementedError

    def _handshake_request(self, header: RequestHeader, frame: bytes) -> tuple[Any, bytes]:
        """A SaslHandshake to go on with: (its request, b""); or refused, the connection closed after the answer:
        (None, the answer, b"" for none)."""
        enabled = list(self.mechanisms)
        if not _offered(header) or header.api_version < SASL_HANDSHAKE_V1:
            self.state = State.CLOSED
            log.warning(f"{self.who}: SaslHandshake version refused (v1 with SaslAuthenticate is required)",
                        extra={"peer": str(self.peer), "api_version": header.api_version})
            if response_type(header) is None:
                # A version past the ones kio knows: answered with v1's body (every SaslHandshake version so far
                # starts with error_code, then the mechanisms) and a v0 response header, as Kafka answers an
                # ApiVersions it does not know at v0 so that any client can read it.
                header = header._replace(api_version=SASL_HANDSHAKE_V1, flexible=False)
            return None, _response(header, {"error_code": ErrorCode.unsupported_version, "mechanisms": enabled})
        req = self._decode(header, frame)
        if req is None:
            return None, b""
        if req.mechanism not in enabled:
            self.state = State.CLOSED
            log.warning(f"{self.who}: SASL mechanism not enabled", extra={
                "peer": str(self.peer), "mechanism": req.mechanism, "enabled": enabled})
            return None, _response(header, {"error_code": ErrorCode.unsupported_sasl_mechanism,
                                            "mechanisms": enabled})
        return req, b""

    def _auth_token(self, header: RequestHeader, frame: bytes) -> tuple[bytes | None, bytes]:
        """A SaslAuthenticate's token: (its bytes, b""); or refused, the connection closed after the answer: (None,
        the answer, b"" for none)."""
        if not _offered(header):
            self.state = State.CLOSED
            return None, _error(header, ErrorCode.unsupported_version, None)
        req = self._decode(header, frame)
        return (None, b"") if req is None else (bytes(req.auth_bytes), b"")

    def _decode(self, header: RequestHeader, frame: bytes) -> Any:
        try:
            return decode_request(frame, header)
        except BadRequestError as err:
            log.warning(f"{self.who}: SASL request does not decode, connection closed",
                        extra={"peer": str(self.peer), "error": str(err)})
            self.state = State.CLOSED
            return None


class SaslSession(_Gate):
    """One connection's SASL, authenticated here against the configured users (see :class:`_Gate`)."""

    def __init__(self, authenticator: SaslAuthenticator, peer: Any = None) -> None:
        super().__init__(authenticator.mechanisms, peer)
        self.authenticator = authenticator
        self._scram: Any = None  # scramp's ScramServer during a SCRAM exchange
        self._claimed_user: str | None = None

    # ------------------------------------------------------------------------------------------- steps
    async def _on_handshake(self, header: RequestHeader, frame: bytes) -> bytes:
        return self._handshake(header, frame)

    def _handshake(self, header: RequestHeader, frame: bytes) -> bytes:
        req, refused = self._handshake_request(header, frame)
        if req is None:
            return refused
        self.mechanism = req.mechanism
        self.state = State.AUTHENTICATE
        return _response(header, {"error_code": ErrorCode.none, "mechanisms": list(self.mechanisms)})

    async def _authenticate(self, header: RequestHeader, frame: bytes) -> bytes:
        token, refused = self._auth_token(header, frame)
        if token is None:
            return refused
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



# ------------------------------------------------------------------------------------ SASL as a proxy
# Kafka's ScramMessages.ClientFirstMessage: gs2 header ("n," + optional authzid + ","), an optional reserved m=
# attribute, the user (RFC 5802's saslname, ASCII, "," and "=" escaped as =2C and =3D), the nonce, then extensions.
_SASLNAME = r"(?:[\x01-\x2B\x2D-\x3C\x3E-\x7F]|=2C|=3D)+"
_SCRAM_CLIENT_FIRST = re.compile(
    rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,(?:m=[\x01-\x2B\x2D-\x7F]+,)?n=(?P<saslname>{_SASLNAME}),"
    r"r=(?P<nonce>[\x21-\x2B\x2D-\x7E]+)(?P<extensions>.*)", re.DOTALL)


def plain_user(token: bytes) -> str | None:
    """The user a PLAIN token (RFC 4616: ``[authzid] NUL authcid NUL passwd``) authenticates as, read as Kafka's
    ``PlainSaslServer`` reads it (its authorization id is the authcid; an authzid, if any, must be the same), or None
    when the broker would refuse it or reads it otherwise (not UTF-8: Java would decode it with replacement
    characters)."""
    parts = token.split(b"\0")
    if len(parts) != 3:
        return None
    try:
        authzid, user, _password = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        return None
    if not user or (authzid and authzid != user):
        return None
    return user


def scram_user(client_first: bytes) -> str | None:
    """The user a SCRAM client-first message authenticates as: its ``n=`` saslname unescaped once (``=2C`` -> ``,``,
    ``=3D`` -> ``=``), as Kafka's ``ScramFormatter.username``; None when Kafka would refuse the message, when its
    authzid is another user, or when it carries extensions (``tokenauth=true`` authenticates a delegation token,
    whose principal is the token's owner, not the name here: not let through)."""
    try:
        message = client_first.decode("ascii")
    except UnicodeDecodeError:
        return None
    m = _SCRAM_CLIENT_FIRST.fullmatch(message)
    if m is None or m["extensions"]:
        return None
    name = m["saslname"].replace("=2C", ",")
    if "=" in name.replace("=3D", ""):
        return None
    user = name.replace("=3D", "=")
    authzid = m["authzid"]
    if authzid is not None and authzid.replace("=2C", ",").replace("=3D", "=") != user:
        return None
    return user


class SaslPassThrough:
    """SASL of a proxying listener: each client authenticates with the broker itself, on its own connection to it.

    The proxy keeps no credentials and checks no password: SaslHandshake and SaslAuthenticate go to the broker
    unchanged, on the client's connection to the broker (:class:`~rlm.listener.upstream.brokers.Upstream`), and the
    broker's answers come back unchanged. So every request the client sends afterwards reaches the broker on a
    connection the broker authenticated as the client: the broker's authorizer decides them for the client's own
    principal, and the sidecar's principal carries none of them. The proxy learns the principal from the exchange
    the broker accepted (:func:`plain_user`, :func:`scram_user`) for the tier's ACL checks: ``User:<name>``, which
    is what Kafka's default principal builder makes of a PLAIN or SCRAM authentication (a broker with a custom
    ``principal.builder.class`` or SASL callback handler that maps names otherwise is not supported).

    ``refused(principal, client address, upstream)`` is the proxy's check of a principal the broker authenticated
    (:meth:`rlm.listener.upstream.hosts.HostCheck.refused`): a message when its requests may not be forwarded (the
    broker would judge them by the proxy's address, host-based ACLs), answered as SASL_AUTHENTICATION_FAILED."""

    def __init__(self, settings: HistorySaslSettings, refused: Callable[[str, str, Any], str | None]) -> None:
        self.mechanisms: tuple[str, ...] = tuple(settings.mechanisms)
        self.refused = refused

    def session(self, peer: Any = None, upstream: Any = None) -> PassThroughSession:
        if upstream is None:
            raise ValueError("SASL pass-through needs the client's connection to the broker")
        return PassThroughSession(self, peer, upstream)


class PassThroughSession(_Gate):
    """One client connection's SASL, passed through to its broker connection ``upstream``. The same interface as
    :class:`SaslSession` for the server (:meth:`gate`, ``principal``, ``authenticated``...)::

        HANDSHAKE     --SaslHandshake v1, mechanism enabled, the broker answers NONE-->    AUTHENTICATE
        AUTHENTICATE  --SaslAuthenticate, the broker answers NONE (PLAIN: 1 round; SCRAM: 2)--> AUTHENTICATED
        any state     --the broker refuses, a token the proxy cannot read, an unexpected request,
                        a principal the proxy may not forward (host-based ACLs)--> closed

    Before the broker said the authentication succeeded, only ApiVersions (answered by the proxy from the broker's
    versions, asked on the client's connection before it authenticates, which Kafka allows) and the SASL requests
    are read; anything else closes the connection without an answer, as :class:`SaslSession`. A token whose user
    cannot be read exactly as the broker reads it is refused here (SASL_AUTHENTICATION_FAILED), not forwarded. A
    failed authentication is the broker's answer (its message, its ``connection.failed.authentication.delay.ms``),
    then both connections close. A principal the broker authenticated whose requests it would judge by the proxy's
    address (host-based ACLs: :mod:`rlm.listener.upstream.hosts`) gets SASL_AUTHENTICATION_FAILED from the proxy
    instead of the broker's success, its message saying why, then both connections close. Re-authentication
    (KIP-368) is declined: a session lifetime the broker grants is answered as 0, so the client never
    re-authenticates; the broker closes the connection when the lifetime ends and the client reconnects and
    authenticates again (later SASL requests get ILLEGAL_SASL_STATE)."""

    who = "proxy"

    def __init__(self, passthrough: SaslPassThrough, peer: Any, upstream: Any) -> None:
        super().__init__(passthrough.mechanisms, peer)
        self.passthrough = passthrough
        self.upstream = upstream
        self._user: str | None = None  # the user of the exchange under way (SCRAM: from its client-first message)

    async def _on_handshake(self, header: RequestHeader, frame: bytes) -> bytes:
        req, refused = self._handshake_request(header, frame)
        if req is None:
            return refused
        answer, body = await self._forward(header, frame)
        if body is None or body.error_code != ErrorCode.none:
            self.state = State.CLOSED  # the broker refused the mechanism: its answer, then closed (as it closes)
        else:
            self.mechanism = req.mechanism
            self.state = State.AUTHENTICATE
        return answer

    async def _authenticate(self, header: RequestHeader, frame: bytes) -> bytes:
        token, refused = self._auth_token(header, frame)
        if token is None:
            return refused
        first = self._user is None
        if first:  # PLAIN's only round, SCRAM's client-first: who is authenticating, read as the broker reads it
            self._user = plain_user(token) if self.mechanism == PLAIN else scram_user(token)
            if self._user is None:
                return self._failed(header, "a token the proxy cannot read as the broker would")
        answer, body = await self._forward(header, frame)
        if body is None:
            return answer
        if body.error_code != ErrorCode.none:
            AUTHENTICATIONS.labels(self.mechanism or "?", "failed").inc()
            log.warning("proxy: the broker refused the client's SASL authentication, connection closed", extra={
                "peer": str(self.peer), "mechanism": self.mechanism, "user": self._user,
                "error": body.error_code.name})
            self.state = State.CLOSED
            return answer
        if self.mechanism != PLAIN and first:
            return answer  # SCRAM's server-first: the client's proof comes next
        # The broker authenticated the client: refused all the same when the broker would judge its requests by the
        # proxy's address (checked only now: before, anyone could learn which users have host-based ACLs); counted
        # and logged by the check
        refused = self.passthrough.refused(user(self._user), peer_host(self.peer), self.upstream)
        if refused is not None:
            self.state = State.CLOSED
            return _error(header, ErrorCode.sasl_authentication_failed, refused)
        AUTHENTICATIONS.labels(self.mechanism or "?", "ok").inc()
        log.info("proxy: client authenticated by the broker", extra={
            "peer": str(self.peer), "mechanism": self.mechanism, "user": self._user})
        self.principal = self._user
        self.state = State.AUTHENTICATED
        lifetime = getattr(body, "session_lifetime", None)
        if lifetime is not None and lifetime.total_seconds() > 0:  # KIP-368 declined (see the class)
            return encode_response(header, dataclasses.replace(body, session_lifetime=timedelta(0)))
        return answer

    async def _forward(self, header: RequestHeader, frame: bytes) -> tuple[bytes, Any]:
        """The broker's answer to the client's SASL request (size prefix included) and its decoded body; (b"",
        None) when the broker's connection failed or its answer does not decode (the connection is closed)."""
        try:
            answer = await self.upstream.request(frame)
            assert answer is not None
            body = decode_response(answer, header)
        except (UpstreamError, BadRequestError) as err:
            log.warning("proxy: the broker's connection failed during SASL authentication, connection closed",
                        extra={"peer": str(self.peer), "error": str(err)})
            self.state = State.CLOSED
            return b"", None
        return SIZE.pack(len(answer)) + answer, body

    def _failed(self, header: RequestHeader, why: str) -> bytes:
        AUTHENTICATIONS.labels(self.mechanism or "?", "failed").inc()
        log.warning("proxy: SASL token refused, connection closed", extra={
            "peer": str(self.peer), "mechanism": self.mechanism, "reason": why})
        self.state = State.CLOSED
        return _error(header, ErrorCode.sasl_authentication_failed, FAILED_MESSAGE)



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
