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

The broker's answers are read by a buffered protocol (:class:`_Answers`), not a stream reader: each answer lands in
one buffer, size prefix included, which the listener sends on to the client as it is (a 1 MiB Fetch answer is copied
by no one), and the task waiting for it wakes once, when it is whole (a stream reader wakes it per chunk read;
``asyncio.wait_for`` made a task per wait: bench_proxy's profile had ~34 event-loop rounds per Fetch). Over plaintext
the listener gives a large answer's buffer back once it is sent (:meth:`Upstream.recycle`), for the next one: a new
1 MiB ``bytearray`` an answer was mapped, zeroed, faulted in and unmapped again each time. A one-partition Fetch
answer is sent on to the client as it comes (:mod:`rlm.listener.upstream.relay`).
:class:`_Answers` can await the rest of a large answer in the kernel (``SO_RCVLOWAT``, :data:`LOWAT_MAX_BYTES` at
most: the socket reported readable once that much has come, not per chunk the broker's 100 KB send buffer lets
through), but the proxy does not use it (:data:`UPSTREAM_LOW_WATER`): it saves event-loop rounds and costs latency.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
from collections import deque
from collections.abc import Mapping
from typing import Any

from confluent_kafka.admin import AdminClient
from prometheus_client import Counter

from rlm.config import split_host_port
from rlm.listener.net.deadline import Deadline
from rlm.listener.protocol.apis import ApiKey, api_label
from rlm.listener.protocol.codec import ErrorCode, decode_response, new_request
from rlm.listener.protocol.frame import (
    CORRELATION_ID,
    REQUEST_CORRELATION_AT,
    SIZE,
    BadRequestError,
    correlation_id_of_response,
)
from rlm.listener.upstream.bounds import KnownBounds
from rlm.listener.upstream.relay import Relay
from rlm.logs import limited_logger

__all__ = ["BROKER_API_VERSIONS_VERSION", "Upstream", "UpstreamError", "broker_address"]

log = limited_logger(__name__)

CLIENT_ID = "rlm-proxy"
BROKER_API_VERSIONS_VERSION = 3  # the ApiVersions we ask the broker (flexible, with its features)
INT32_MASK = 0x7FFFFFFF
REQUESTS = Counter("rlm_history_upstream_requests", "Requests a proxying listener sent its broker, the clients' "
                   "forwarded and its own (ListOffsets for the tier's bounds, ApiVersions at connect)", ["api"])
SCRATCH_BYTES = 64 * 1024  # what one read between answers takes at most (larger answers are read in place)
# The rest of an answer larger than the scratch is awaited in the kernel up to this much at a time (SO_RCVLOWAT; the
# kernel grows the socket's receive buffer to hold it): one event-loop round for it, not one per chunk that arrives.
LOWAT_MAX_BYTES = 4 * 1024 * 1024
# Off: with the mark a 1 MiB live Fetch through the proxy took 5.25 ms a round trip instead of 1.85 ms (bench_proxy
# --gib 0.5, quiet machine, side by side: 194 vs 547 MB/s, 0.96 vs 0.61 ms of sidecar CPU a Fetch): the answer waits
# in the receive buffer while the broker waits for window, where reading it as it comes keeps the window open.
UPSTREAM_LOW_WATER = False


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


class _Answers(asyncio.BufferedProtocol):
    """The broker's side of one upstream connection: its answers read straight into one buffer each, size prefix
    included (the socket's bytes land where they are sent from to the client: no copy of a large Fetch answer but
    the first chunk's), each handed over once whole, in order; no task woken per chunk read."""

    def __init__(self, max_response_bytes: int, *, low_water: bool = False) -> None:
        self.max_response_bytes = max_response_bytes
        self.transport: asyncio.Transport | None = None
        # the raw socket, to set SO_RCVLOWAT on (plaintext only: TLS bytes held in the transport would not count)
        self._lowat_socket: Any = None
        self._low_water = low_water
        self._lowat = 1  # the socket's SO_RCVLOWAT now
        self._scratch = bytearray(SCRATCH_BYTES)  # reads between answers: size prefixes and small answers
        self._scratch_len = 0
        self._frame: bytearray | None = None  # the answer being read (larger than what the scratch held)
        self._spare: bytearray | None = None  # a large answer's buffer, sent and given back (recycle)
        self._frame_len = 0
        self._answers: deque[bytearray] = deque()
        self.relay: Relay | None = None  # the cut-through of the next answer begun (armed by Upstream.forward)
        self._relaying: Relay | None = None  # the answer being read's
        self._waiter: asyncio.Future[None] | None = None  # an answer, or the connection lost
        self._drained: asyncio.Future[None] | None = None  # writing may go on (resume_writing)
        self.paused = False
        self.error: UpstreamError | None = None

    # ------------------------------------------------------------------ the transport's calls
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self._low_water:
            self._lowat_socket = transport.get_extra_info("socket")

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._frame_len:]
        return memoryview(self._scratch)[self._scratch_len:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame is not None:
            self._frame_len += nbytes
            if self._relaying is not None:
                self._relaying.advance(self._frame, self._frame_len)
            if self._frame_len == len(self._frame):
                frame, self._frame = self._frame, None
                self._low_water_at(1)
                self._answered(frame)
            else:
                self._low_water_at(len(self._frame) - self._frame_len)
            return
        self._scratch_len += nbytes
        scratch, pos, end = self._scratch, 0, self._scratch_len
        while end - pos >= SIZE.size:
            (size,) = SIZE.unpack_from(scratch, pos)
            if not 4 <= size <= self.max_response_bytes:
                self._lost(UpstreamError(f"the broker's answer of {size} bytes is outside "
                                         f"4..{self.max_response_bytes}"))
                return
            frame = self._buffer_of(SIZE.size + size)
            have = min(end - pos, len(frame))
            frame[:have] = scratch[pos:pos + have]
            pos += have
            self._relaying, self.relay = self.relay, None
            if self._relaying is not None:
                self._relaying.advance(frame, have)
            if have < len(frame):  # the rest is read into it directly, once it has come (or the most awaited)
                self._frame, self._frame_len = frame, have
                self._low_water_at(len(frame) - have)
                break
            self._answered(frame)
        left = end - pos
        if left:  # a size prefix not yet whole (same-length assignment: the buffer is exported)
            scratch[:left] = scratch[pos:end]
        self._scratch_len = left

    def _buffer_of(self, nbytes: int) -> bytearray:
        """A buffer of ``nbytes`` for an answer: the spare one given back (:meth:`recycle`) for a large answer, sized
        to it, its old bytes all written over before the answer is handed on; else a new one. A new 1 MiB bytearray
        costs more than its zeroing: its pages are mapped, faulted in and unmapped again with each answer."""
        spare = self._spare
        if spare is not None and nbytes > SCRATCH_BYTES:
            self._spare = None
            try:
                if len(spare) > nbytes:
                    del spare[nbytes:]  # in place: CPython keeps the allocation down to half of it
                elif len(spare) < nbytes:
                    spare.extend(bytes(nbytes - len(spare)))
                return spare
            except BufferError:  # still viewed somewhere: not to be written over
                pass
        return bytearray(nbytes)

    def recycle(self, frame: bytearray) -> None:
        """``frame``, an answer handed over, is sent (or copied by the transport): its buffer may serve the next."""
        if len(frame) > SCRATCH_BYTES:
            self._spare = frame

    def _low_water_at(self, nbytes: int) -> None:
        """The socket reported readable once ``nbytes`` (at most :data:`LOWAT_MAX_BYTES`) have come: the kernel
        still wakes the loop earlier when the connection closes or its receive buffer runs short."""
        nbytes = min(nbytes, LOWAT_MAX_BYTES)
        if self._lowat_socket is None or nbytes == self._lowat:
            return
        try:
            self._lowat_socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
        except OSError:  # a closed socket: connection_lost follows
            self._lowat_socket = None
            return
        self._lowat = nbytes

    def eof_received(self) -> bool:
        return False  # the transport closes: connection_lost

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(UpstreamError(f"the broker closed the connection{f': {exc}' if exc else ''}"), close=False)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # ------------------------------------------------------------------ the connection's
    def _answered(self, frame: bytearray) -> None:
        self._answers.append(frame)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _lost(self, err: UpstreamError, *, close: bool = True) -> None:
        if self.error is None:
            self.error = err
        for fut in (self._waiter, self._drained):
            if fut is not None and not fut.done():
                fut.set_result(None)
        if close and self.transport is not None:
            self.transport.abort()

    def answer(self) -> bytearray | asyncio.Future[None]:
        """The next whole answer, or a future done when one may be there (or the connection is lost)."""
        if self._answers:
            return self._answers.popleft()
        if self.error is not None:
            raise self.error
        self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter

    def drained(self) -> asyncio.Future[None] | None:
        """A future done once the transport takes writes again; None when it does."""
        if not self.paused or self.error is not None:
            return None
        self._drained = asyncio.get_running_loop().create_future()
        return self._drained


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
        # the versions the proxy offers this connection's client (routing.Router.versions of ``versions``), kept
        # here by the listener: one memo per connection, not the router's one for all (which many clients thrash)
        self.offered: dict[int, tuple[int, int]] | None = None
        self._answers: _Answers | None = None
        self._next_id = 0
        self.known = KnownBounds()  # the broker's bounds learned on this connection (the proxy's history Fetches)
        self.prefetched: Any = None  # the proxy's answer from the tier read ahead for this client's next Fetch
        self._deadline: Deadline | None = None  # the broker's answer (or taking a request) is awaited until then
        self._awaited: asyncio.Future[None] | None = None
        # the client's transport, for cut-through of Fetch answers (rlm.listener.upstream.relay); set by the listener,
        # as are the largest receive window the client advertised after a large answer (relay.peer_window) and
        # whether that window is smaller than the last large answer (the client takes answers a window at a time)
        self.client: asyncio.WriteTransport | None = None
        self.client_window = 0
        self.client_paced = False
        # the proxy's address as the broker sees it (this connection's local address, once connected), and the ACL
        # view's generation (rlm.listener.authz.AclCache.generation) this connection's client was found forwardable
        # in (rlm.listener.upstream.hosts)
        self.local_host: str | None = None
        self.forwardable_in: int | None = None

    @classmethod
    def of(cls, address: str, *, timeout_s: float, max_response_bytes: int,
           ssl_context: ssl.SSLContext | None = None) -> Upstream:
        host, port = split_host_port(address)
        return cls(host, port, timeout_s=timeout_s, max_response_bytes=max_response_bytes, ssl_context=ssl_context)

    async def ready(self) -> None:
        """Connected, and the broker's versions known (asked once per connection: a restarted broker may differ)."""
        if self._answers is not None:
            return
        loop = asyncio.get_running_loop()
        try:
            low_water = UPSTREAM_LOW_WATER and self.ssl_context is None  # plaintext only: TLS bytes would not count
            transport, self._answers = await asyncio.wait_for(loop.create_connection(
                lambda: _Answers(self.max_response_bytes, low_water=low_water), self.host, self.port,
                ssl=self.ssl_context, server_hostname=self.host if self.ssl_context is not None else None),
                self.timeout_s)
        except (OSError, TimeoutError) as err:  # ssl.SSLError (a certificate refused) is an OSError
            raise UpstreamError(f"cannot connect to the broker at {self.host}:{self.port}: {err}") from err
        sockname = transport.get_extra_info("sockname")
        self.local_host = str(sockname[0]) if isinstance(sockname, tuple) else None
        frame, header = new_request(ApiKey.API_VERSIONS, BROKER_API_VERSIONS_VERSION, self._correlation_id(),
                                    CLIENT_ID, {"client_software_name": CLIENT_ID, "client_software_version": "1"})
        answer = bytes(memoryview(await self._exchange(frame, header.correlation_id))[SIZE.size:])
        try:
            body = decode_response(answer, header)
        except BadRequestError as err:
            raise UpstreamError(f"the broker's ApiVersions answer does not decode: {err}") from err
        if body.error_code != ErrorCode.none:
            raise UpstreamError(f"the broker answers ApiVersions with {body.error_code.name}")
        self.broker_api_versions = body
        self.versions = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}
        self.offered = None

    async def ask(self, api_key: int, api_version: int, values: Mapping[str, Any]) -> Any:
        """A request of the proxy's own (kio values) on this connection; the broker's decoded answer."""
        await self.ready()
        frame, header = new_request(api_key, api_version, self._correlation_id(), CLIENT_ID, values)
        answer = bytes(memoryview(await self._exchange(frame, header.correlation_id))[SIZE.size:])
        try:
            return decode_response(answer, header)
        except BadRequestError as err:
            self.close()
            raise UpstreamError(f"the broker's answer to api key {api_key} does not decode: {err}") from err

    async def request(self, frame: bytes, *, answered: bool = True) -> bytes | None:
        """Forward one client request (a frame without its size prefix); its answer (without size prefix) with the
        client's correlation id, or None when the broker sends none (Produce with acks=0)."""
        framed = await self.forward(frame, answered=answered)
        return None if framed is None else bytes(memoryview(framed)[SIZE.size:])

    async def forward(self, frame: bytes, *, answered: bool = True, relay: Relay | None = None) -> bytearray | None:
        """As :meth:`request`, the answer as it goes to the client: size prefix included, in the one buffer it was
        read into (no copy). ``relay``: its bytes that may go early are sent to the client as they come
        (:mod:`rlm.listener.upstream.relay`: the caller finishes or aborts it)."""
        await self.ready()
        client_id = int.from_bytes(frame[4:8], "big", signed=True)
        ours = self._correlation_id()
        data = bytearray(SIZE.size + len(frame))
        SIZE.pack_into(data, 0, len(frame))
        data[SIZE.size:] = frame
        CORRELATION_ID.pack_into(data, SIZE.size + REQUEST_CORRELATION_AT, ours)
        if not answered:
            await self._send(data)
            return None
        answer = await self._exchange(data, ours, relay)
        CORRELATION_ID.pack_into(answer, SIZE.size, client_id)
        return answer

    async def _send(self, data: bytes | bytearray) -> None:
        _requests(int.from_bytes(data[4:6], "big", signed=True)).inc()
        answers = self._answers
        assert answers is not None and answers.transport is not None
        if answers.error is not None:
            self.close()
            raise answers.error
        answers.transport.write(data)
        drained = answers.drained()
        if drained is not None:
            await self._within(drained, "does not take requests")
        if answers.error is not None:
            self.close()
            raise answers.error

    async def _exchange(self, data: bytes | bytearray, correlation_id: int, relay: Relay | None = None
                        ) -> bytearray:
        """``data`` (a request, size prefix included) sent; the next answer, size prefix included (``relay``: its
        cut-through, armed for it)."""
        answers = self._answers
        assert answers is not None
        if relay is not None:
            relay.upstream_id = correlation_id
        answers.relay = relay
        await self._send(data)
        try:
            got = answers.answer()
            while not isinstance(got, bytearray):
                await self._within(got, "did not answer")
                got = answers.answer()
        except UpstreamError:
            self.close()
            raise
        answer_id = (correlation_id if relay is not None and relay.sent  # checked before it went, then replaced
                     else correlation_id_of_response(memoryview(got)[SIZE.size:]))
        if answer_id != correlation_id:
            self.close()
            raise UpstreamError(f"the broker answered correlation id {answer_id}, expected {correlation_id}")
        return got

    async def _within(self, fut: asyncio.Future[None], what: str) -> None:
        """``fut`` awaited for at most the timeout (the connection's one timer, :class:`Deadline`: not a task per
        wait as ``asyncio.wait_for``'s, nor a timer per wait)."""
        loop = asyncio.get_running_loop()
        if self._deadline is None:
            self._deadline = Deadline(loop, self._expire)
        self._awaited = fut
        self._deadline.arm(loop.time() + self.timeout_s)
        try:
            await fut
        except TimeoutError:
            self.close()
            raise UpstreamError(f"the broker at {self.host}:{self.port} {what} within {self.timeout_s} s") from None
        finally:
            self._awaited = None
            if self._deadline is not None:
                self._deadline.disarm()

    def _expire(self) -> None:
        fut = self._awaited
        if fut is not None and not fut.done():
            fut.set_exception(TimeoutError())

    def _correlation_id(self) -> int:
        self._next_id = (self._next_id + 1) & INT32_MASK
        return self._next_id

    def answered_large(self, size: int, window: int | None) -> None:
        """A Fetch answer of ``size`` bytes was handed to the client, whose window is now ``window`` (None: unknown):
        whether the next is cut through (:mod:`rlm.listener.upstream.relay`)."""
        if window is None:
            self.client_paced = False
            return
        self.client_window = max(self.client_window, window)
        self.client_paced = self.client_window < size

    def recycle(self, frame: bytearray) -> None:
        """``frame``, an answer :meth:`forward` gave and the listener has sent (the transport took it or copied what
        its socket did not: nothing references it), serves the next large answer instead of a new buffer."""
        if self._answers is not None:
            self._answers.recycle(frame)

    def close(self) -> None:
        if self._answers is not None and self._answers.transport is not None:
            self._answers.transport.close()
        self._answers = None
        self.versions = {}
        self.offered = None
        self.known.clear()
        self.prefetched = None
        self.local_host = self.forwardable_in = None
        if self._deadline is not None:
            self._deadline.close()
            self._deadline = None


@functools.cache
def _requests(api_key: int) -> Any:
    """The api key's child of :data:`REQUESTS` (looked up once: ``labels`` per request was 2% of the live path)."""
    return REQUESTS.labels(api_label(api_key))

