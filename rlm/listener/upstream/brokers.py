"""A client connection's connection to the broker the sidecar runs next to.

Each client connection of a proxying listener gets its own connection to the broker, opened at its first request
and closed with it, so that the broker sees one connection per client (its quotas, its per-connection order and its
fetch long polls stay per client). The connection speaks what the broker's listener speaks
(``history_listener.upstream_security_protocol``): TLS as a Kafka client does it (``upstream_tls``: the broker's
certificate checked against its CA and host name), and SASL as the client's own: the proxy does not authenticate to
the broker, the client does, through it (:class:`rlm.listener.net.sasl.PassThroughSession`), so every request on the
connection is the client's principal's, the proxy's own included (its ListOffsets for the tier's bounds). Without
``sasl`` the listener forwards to a PLAINTEXT (or SSL) listener, where every client is ``User:ANONYMOUS``.

Correlation ids are ours on this connection: a forwarded request gets the connection's next id, and its answer goes
back with the client's, so the proxy's own requests (ApiVersions at connect) share the connection without clashing.
Requests are answered in order, as Kafka answers them on one connection; an answer whose id is not the one expected,
a broker that closes the connection or does not answer within the timeout ends the connection: the client's is
closed too (:class:`UpstreamError`), and it reconnects as it does when a broker goes away.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Mapping
from typing import Any

from confluent_kafka.admin import AdminClient

from rlm.config import split_host_port
from rlm.listener.protocol.apis import ApiKey
from rlm.listener.protocol.codec import ErrorCode, decode_response, new_request
from rlm.listener.protocol.frame import SIZE, BadRequestError, correlation_id_of_response, with_correlation_id

__all__ = ["BROKER_API_VERSIONS_VERSION", "Upstream", "UpstreamError", "broker_address"]

log = logging.getLogger(__name__)

CLIENT_ID = "rlm-proxy"
BROKER_API_VERSIONS_VERSION = 3  # the ApiVersions we ask the broker (flexible, with its features)
INT32_MASK = 0x7FFFFFFF


class UpstreamError(Exception):
    """The broker could not be reached, broke the connection or answered out of turn: the client's connection is
    closed with it (the client reconnects, as after losing a broker)."""


def broker_address(client_config: Mapping[str, Any], broker_id: int, timeout_s: float = 15.0) -> tuple[str, int]:
    """The address the cluster's metadata gives for ``broker_id`` (on the listener the sidecar's own client uses).
    Raises :class:`UpstreamError` when the cluster does not answer or does not list the broker."""
    admin = AdminClient(dict(client_config))
    try:
        brokers = admin.list_topics(timeout=timeout_s).brokers
    except Exception as err:  # noqa: BLE001 - KafkaException: no answer
        raise UpstreamError(f"cannot ask the cluster for broker {broker_id}'s address: {err}") from err
    b = brokers.get(broker_id)
    if b is None:
        raise UpstreamError(f"the cluster's metadata lists no broker {broker_id} (it lists {sorted(brokers)}): "
                            "set history_listener.upstream to the broker's listener")
    return b.host, b.port


class Upstream:
    """One client connection's connection to the broker (on the listener's event loop only)."""

    def __init__(self, host: str, port: int, *, timeout_s: float, max_response_bytes: int,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.port = port
        self.ssl_context = ssl_context  # TLS to the broker (upstream_tls), else plaintext
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes
        self.versions: dict[int, tuple[int, int]] = {}  # the broker's api key -> (min, max), once connected
        self.broker_api_versions: Any = None  # the broker's ApiVersions answer (its features), once connected
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._next_id = 0

    @classmethod
    def of(cls, address: str, *, timeout_s: float, max_response_bytes: int,
           ssl_context: ssl.SSLContext | None = None) -> Upstream:
        host, port = split_host_port(address)
        return cls(host, port, timeout_s=timeout_s, max_response_bytes=max_response_bytes, ssl_context=ssl_context)

    async def ready(self) -> None:
        """Connected, and the broker's versions known (asked once per connection: a restarted broker may differ)."""
        if self._writer is not None:
            return
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=1 << 20, ssl=self.ssl_context,
                                        server_hostname=self.host if self.ssl_context is not None else None),
                self.timeout_s)
        except (OSError, TimeoutError) as err:  # ssl.SSLError (a certificate refused) is an OSError
            raise UpstreamError(f"cannot connect to the broker at {self.host}:{self.port}: {err}") from err
        frame, header = new_request(ApiKey.API_VERSIONS, BROKER_API_VERSIONS_VERSION, self._correlation_id(),
                                    CLIENT_ID, {"client_software_name": CLIENT_ID, "client_software_version": "1"})
        answer = await self._exchange(frame, header.correlation_id)
        try:
            body = decode_response(answer, header)
        except BadRequestError as err:
            raise UpstreamError(f"the broker's ApiVersions answer does not decode: {err}") from err
        if body.error_code != ErrorCode.none:
            raise UpstreamError(f"the broker answers ApiVersions with {body.error_code.name}")
        self.broker_api_versions = body
        self.versions = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}

    async def ask(self, api_key: int, api_version: int, values: Mapping[str, Any]) -> Any:
        """A request of the proxy's own (kio values) on this connection; the broker's decoded answer."""
        await self.ready()
        frame, header = new_request(api_key, api_version, self._correlation_id(), CLIENT_ID, values)
        answer = await self._exchange(frame, header.correlation_id)
        try:
            return decode_response(answer, header)
        except BadRequestError as err:
            self.close()
            raise UpstreamError(f"the broker's answer to api key {api_key} does not decode: {err}") from err

    async def request(self, frame: bytes, *, answered: bool = True) -> bytes | None:
        """Forward one client request (a frame without its size prefix); its answer (without size prefix) with the
        client's correlation id, or None when the broker sends none (Produce with acks=0)."""
        await self.ready()
        client_id = int.from_bytes(frame[4:8], "big", signed=True)
        ours = self._correlation_id()
        data = SIZE.pack(len(frame)) + with_correlation_id(frame, ours, request=True)
        if not answered:
            await self._send(data)
            return None
        answer = await self._exchange(data, ours)
        return with_correlation_id(answer, client_id, request=False)

    async def _send(self, data: bytes) -> None:
        assert self._writer is not None
        try:
            self._writer.write(data)
            await asyncio.wait_for(self._writer.drain(), self.timeout_s)
        except (OSError, TimeoutError) as err:
            self.close()
            raise UpstreamError(f"the broker at {self.host}:{self.port} does not take requests: {err}") from err

    async def _exchange(self, data: bytes, correlation_id: int) -> bytes:
        await self._send(data)
        assert self._reader is not None
        try:
            (size,) = SIZE.unpack(await asyncio.wait_for(self._reader.readexactly(SIZE.size), self.timeout_s))
            if not 4 <= size <= self.max_response_bytes:
                raise UpstreamError(f"the broker's answer of {size} bytes is outside 4..{self.max_response_bytes}")
            answer = await asyncio.wait_for(self._reader.readexactly(size), self.timeout_s)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as err:
            self.close()
            raise UpstreamError(f"the broker at {self.host}:{self.port} did not answer: "
                                f"{type(err).__name__}: {err}") from err
        except UpstreamError:
            self.close()
            raise
        got = correlation_id_of_response(answer)
        if got != correlation_id:
            self.close()
            raise UpstreamError(f"the broker answered correlation id {got}, expected {correlation_id}")
        return answer

    def _correlation_id(self) -> int:
        self._next_id = (self._next_id + 1) & INT32_MASK
        return self._next_id

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
        self.versions = {}
