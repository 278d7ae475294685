"""The listener's socket server: asyncio on its own thread, answers on a worker pool.

Each connection is served in order, as a broker does (a client may pipeline requests; responses go back in the
order they came). Reading the store blocks, so handlers run on a thread pool; the event loop only frames bytes:
decoding a request larger than ``INLINE_FRAME_BYTES``, and building and encoding every answer but ApiVersions', run
on the pool too (a Fetch of 300,000 partitions, a 4.8 MB frame: about 50 ms to decode, seconds to build and encode
its answer), so one connection's large request never holds another's. They still share the GIL, and what holds it
in one piece holds the event loop that long. Python code holds it at most ``sys.getswitchinterval()`` (5 ms) at a
time. kio's decoder is native code that held it for a whole frame (the 4.8 MB one about 50 ms, in proportion to its
size: a second for 100 MiB), so a large request is decoded an array item at a time, and what it and its answer
made (hundreds of thousands of objects: tens of ms to free in one deallocation) is freed a slice at a time, on a
worker (:func:`~rlm.listener.protocol.codec.decode_request` and :func:`~rlm.listener.protocol.codec.free_gradually`).
The cyclic GC's full collections held it up to 170 ms each, eight times over, as a large request's objects grew the
heap: the GC is held off while large requests are worked on (:class:`GcPause`). ``bench/bench_listener_stall.py``
measures the event loop's lag while one connection sends a large Fetch.
A Fetch with less than ``min_bytes`` of data waits up to ``max_wait_ms`` (at most ``fetch_max_wait_ms``) for newly
tiered data, as Kafka's DelayedFetch: it becomes one :class:`~rlm.listener.tier.polls.PendingFetch` (its partitions,
deadline, ``min_bytes``, its connection, the tier bounds it was answered from) in the server's
:class:`~rlm.listener.tier.polls.LongPolls`. One ticker serves them all: every ``poll_s`` it drops the polls whose
client closed the connection (no tier read for them), then re-reads the bounds of every partition anyone waits on, once
each, in one worker job (the metadata manager's consumer keeps the cache it reads up to date meanwhile), and wakes only
the polls one of whose partitions changed (a segment tiered, the log start moved); those re-run their fetch, at most
``workers // 2`` at a time. A poll is answered when it has ``min_bytes``, or at its deadline with what it had (a timer,
no tier read). A waiting Fetch holds no worker thread: N polls on one partition cost one bounds read per tick, not N
fetches, and cannot fill the pool.

Answers queued to clients are bounded: a connection's next request is served (and a large one read) only once its
last answer has been taken whole by the socket, whose kernel buffer is ``socket_send_buffer_bytes`` (back-pressure,
as a broker mutes a channel with a response in flight); an answer up to ``WRITE_SLICE_BYTES`` is handed to its
transport whole and not waited for (:class:`_QueuedAnswer`: the next request waits, if the client sends it before
it has read the answer); a larger one a slice at a time, each waited for, so that a client that does not read
holds its answer once, plus a slice at most in its transport (and the event loop never copies a large answer in one
piece; large request frames are likewise taken ``READ_SLICE_BYTES`` at a time); a client that
takes none of it for ``write_timeout_ms``, or not all of it within ``connections_max_idle_ms``, is closed
(``not_reading``); and a Fetch answer carries no more records than what is left of ``queued_max_response_bytes``
across all connections (the first batch still, so that consumers progress), so clients that do not read cannot make
the sidecar hold more than that (plus a batch each). ``rlm_history_queued_response_bytes`` is what is queued now
(a running total, :meth:`ListenerServer.queued_response_bytes`).

Connections are bounded (:class:`ConnectionLimits`, from ``history_listener``): past ``max_connections`` in all or
``max_connections_per_ip`` from one address a new connection is closed at once; a connection that sends no whole
request for ``connections_max_idle_ms``, that does not take its answer within that time, or (SASL) that has not
authenticated ``authentication_timeout_ms`` after it was accepted is closed. Each is counted
(``rlm_history_closed_connections{reason}``).

Bad input never takes the server down: a request whose header can be read gets an error response
(UNSUPPORTED_VERSION for an API or version not offered, INVALID_REQUEST for a body that does not decode) and the
connection stays open; a frame that cannot be a Kafka request or is too large (a size below the header's or above
``socket_request_max_bytes``, Kafka's ``socket.request.max.bytes``: garbage, TLS or HTTP on the plaintext port, or a
request too large to hold) closes that connection unread, as a broker does, since the stream can no longer be
framed. Both are logged and counted (``rlm_history_bad_requests``). An
unexpected error on a connection that has not authenticated (SASL) closes it with a WARNING line and no traceback
(counted as ``internal``): a client that has not said who it is cannot write ERROR tracebacks to the log.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import functools
import gc
import math
import mmap
import socket
import ssl
import sys
import threading
import time
import typing
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from rlm.config import HistoryListenerSettings
from rlm.listener.net.chunked import ChunkedAnswer, encode_streamed
from rlm.listener.net.deadline import Deadline
from rlm.listener.net.principals import ANONYMOUS, Client, NoMatchingRuleError, PrincipalMapper, peer_host, user
from rlm.listener.net.request_room import Owners, RequestRoom
from rlm.listener.net.vectored import QUEUE_AT_MOST_BYTES, send_parts, vectored, write_parts
from rlm.listener.protocol.apis import ApiKey, api_label
from rlm.listener.protocol.codec import (
    ErrorCode,
    build,
    decode_request,
    encode_response,
    error_body,
    free_gradually,
    response_type,
    warm_schemas,
)
from rlm.listener.protocol.frame import MAX_FRAME_BYTES, SIZE, BadRequestError, RequestHeader, read_header
from rlm.listener.routing import Route, Router
from rlm.listener.tier.polls import EXPIRED, GONE, LongPolls, Mark, PendingFetch, tier_marks
from rlm.listener.upstream.brokers import Upstream, UpstreamError
from rlm.listener.upstream.relay import RELAY_MIN_BYTES, Relayed, peer_window
from rlm.logs import limited_logger
from rlm.tier import StreamedBatch, UnreadableCopyError

__all__ = ["ConnectionLimits", "GcPause", "ListenerServer", "steady_malloc"]

log = limited_logger(__name__)

REQUESTS = Counter("rlm_history_requests", "Requests answered by the history endpoint", ["api", "error"])
BYTES_SENT = Counter("rlm_history_bytes_sent", "Response bytes sent by the history endpoint", ["api"])
RECORD_BYTES = Counter("rlm_history_record_bytes", "Record-batch bytes served by Fetch", ["topic"])
LATENCY = Histogram("rlm_history_request_seconds", "Time to answer one request (Fetch waits included)", ["api"],
                    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
BAD = Counter("rlm_history_bad_requests", "Requests or frames that could not be read", ["reason"])
CONNECTIONS = Counter("rlm_history_connections", "Connections accepted by the history endpoint")
CLOSED = Counter("rlm_history_closed_connections", "Connections the history endpoint closed for a bound",
                 ["reason"])  # idle, authentication_timeout, not_reading, max_connections, max_connections_per_ip,
# principal_mapping, request_memory
QUEUED = Gauge("rlm_history_queued_response_bytes", "Answer bytes queued to clients (not yet taken by them) now")
_SERVING: weakref.WeakSet[ListenerServer] = weakref.WeakSet()  # servers started and not stopped: QUEUED sums them
QUEUED.set_function(lambda: sum(s._queued for s in list(_SERVING)))  # read when scraped: no lock per answer
REQUEST_HELD = Gauge("rlm_history_queued_request_bytes",
                     "Request bytes held against queued_max_request_bytes (frames over 64 KiB being read or served)")
REQUEST_HELD.set_function(lambda: sum(s.requests.held + s.pre_auth_requests.held for s in list(_SERVING)))
WRITE_POLL_S = 1.0  # how often a queued answer is checked for progress (write_timeout_ms)
# an answer is handed to its transport at most this much at a time (ListenerServer._send), each slice waited for;
# one up to this size (a consumer's usual answer: max.partition.fetch.bytes, 1 MiB, and its headers) is written in
# one piece and not waited for (ListenerServer._write)
WRITE_SLICE_BYTES = 2 << 20
FETCH_KEY = ApiKey.FETCH.to_bytes(2, "big")  # a request frame's first bytes
FREE_WHOLE_STRUCTS = 1024  # an answer built of at most this many structs is freed whole (_encoded)
READ_SLICE_BYTES = 256 * 1024  # a request frame larger than this is taken from the stream this much at a time
# A connection's stream stops reading from its socket once it buffers twice this (plus one receive, 256 KiB): what a
# client can make the server hold beyond the request being served. A frame larger than this takes its size from
# queued_max_request_bytes before its body is read (rlm.listener.net.request_room). 1 MiB before: 200 connections
# of one address could each buffer 2.25 MiB that no bound counted.
READER_LIMIT_BYTES = 64 * 1024
# Before SASL authentication, frames over READER_LIMIT_BYTES take from a room of their own, queued_max_request_bytes
# divided by this (32 MiB by default): a frame's 4-byte size takes its room, so strangers could otherwise fill the
# shared room with sizes alone and make authenticated requests wait for their authentication deadline (h3, session
# 18: 513 connections from three addresses, 256 of 256 MiB held, an authenticated 78 KiB Fetch waited 26.8 s).
PRE_AUTH_ROOM_SHARE = 8
# A connection whose answers outgrow socket_send_buffer_bytes gets this SO_SNDBUF (the kernel holds twice it: a
# consumer's 1 MiB answer taken in one system call, not in ~5 event-loop rounds), while the kernel buffers so raised
# stay within 1/SEND_BUFFER_RAISED_SHARE of queued_max_response_bytes, which they are counted against.
SEND_BUFFER_RAISED_BYTES = 1 << 20
SEND_BUFFER_RAISED_MAX_BYTES = 4 << 20  # answers larger than 2 MiB get half their size, up to this
SEND_BUFFER_RAISED_SHARE = 4
REFUSAL_LOG_INTERVAL_S = 60.0

NO_RESPONSE = b""  # a request that gets no response (Produce with acks=0)
MOST_RECORDS_PARTITIONS = 1024  # a Fetch of at most this many partitions holds of the queued bound what they can bring
INLINE_FRAME_BYTES = 64 * 1024  # a request frame larger than this is decoded on a worker, not on the event loop
GC_PAUSE_MAX_S = 30.0  # the longest the cyclic GC is held off for large requests in a row (GcPause)
LARGE_REQUEST_SWITCH_INTERVAL_S = 0.001  # the interpreter's switch interval while large requests are worked on
MALLOC_THRESHOLD_BYTES = 4 * 1024 * 1024  # glibc's mmap and trim thresholds, fixed (steady_malloc)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h mallopt parameters
PR_SET_NAME = 15  # prctl's: the calling thread's name (comm) as the OS shows it, 15 bytes at most
# the OS names of the listener's threads (top -H, /proc/<pid>/task/<tid>/comm): its CPU told apart by thread
LOOP_THREAD_NAME, WORKER_THREAD_NAME = "rlm-listen-loop", "rlm-listen-work"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The bounds a connection is held to (``history_listener``'s keys, in seconds); the defaults are the config's.
    ``idle_s`` also bounds the time to send one whole request and to take one answer (a client that does not read
    is closed); ``authentication_timeout_s`` applies to SASL listeners (and to the TLS handshake)."""

    idle_s: float = 600.0
    authentication_timeout_s: float = 30.0
    max_connections: int = 1000
    max_connections_per_ip: int = 200
    fetch_max_wait_s: float = 0.5
    request_max_bytes: int = MAX_FRAME_BYTES
    write_timeout_s: float = 30.0
    socket_send_buffer_bytes: int = 102_400
    queued_max_response_bytes: int = 256 * 1024 * 1024
    queued_max_request_bytes: int = 256 * 1024 * 1024

    @classmethod
    def of(cls, cfg: HistoryListenerSettings) -> ConnectionLimits:
        return cls(idle_s=cfg.connections_max_idle_ms / 1000,
                   authentication_timeout_s=cfg.authentication_timeout_ms / 1000,
                   max_connections=cfg.max_connections, max_connections_per_ip=cfg.max_connections_per_ip,
                   fetch_max_wait_s=cfg.fetch_max_wait_ms / 1000, request_max_bytes=cfg.socket_request_max_bytes,
                   write_timeout_s=cfg.write_timeout_ms / 1000, socket_send_buffer_bytes=cfg.socket_send_buffer_bytes,
                   queued_max_response_bytes=cfg.queued_max_response_bytes,
                   queued_max_request_bytes=cfg.queued_max_request_bytes)


class ListenerServer:
    """``start()`` binds and serves on a thread of its own; ``stop()`` closes every connection."""

    def __init__(self, router: Router, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                 workers: int = 8, poll_s: float = 0.2,
                 session_factory: Callable[[Any, Any], Any] | None = None, limits: ConnectionLimits | None = None,
                 principal_mapper: PrincipalMapper | None = None) -> None:
        self.router = router
        self.principal_mapper = principal_mapper or PrincipalMapper()
        self.limits = limits or ConnectionLimits()
        self._open = 0  # connections served now, in all and per address (on the event loop only)
        self._per_ip: dict[str, int] = {}
        self._refusal_logged: dict[str, float] = {}
        self.requests = RequestRoom(self.limits.queued_max_request_bytes)  # request frames held (loop only)
        # before SASL authentication, frames take from a room of their own (an eighth more): strangers who fill it
        # (their 4-byte sizes alone take it) make nobody who authenticated wait, and are closed, not queued
        self.pre_auth_requests = RequestRoom(self.limits.queued_max_request_bytes // PRE_AUTH_ROOM_SHARE)
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.poll_s = poll_s
        self.session_factory = session_factory
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="rlm-history",
                                                           initializer=name_os_thread, initargs=(WORKER_THREAD_NAME,))
        self._workers = _Workers(self._pool)  # the pool as a proxy runs its blocking parts (upstream.proxy.Run)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._reserved = 0  # bytes of Fetch answers being made, held against queued_max_response_bytes (loop only)
        self._queued = 0  # answer bytes handed to _send and not yet taken by the sockets (loop only; a running total)
        self._queued_answers: set[_QueuedAnswer] = set()  # answers written whole not yet taken (_write)
        self._raised = 0  # kernel send-buffer bytes of the connections whose SO_SNDBUF was raised (_raise_send_buffer)
        self._queued_ticker: asyncio.TimerHandle | None = None  # checks their progress while there are any
        self._polls = LongPolls(router.ctx.tier, self._pool, poll_s)  # waiting Fetches (long polls)
        self._rerun_slots = asyncio.Semaphore(max(workers // 2, 1))  # workers long polls may hold at once

    # --------------------------------------------------------------------------------------- life
    def start(self) -> ListenerServer:
        steady_malloc()
        warm_schemas(self.router.offered)
        _SERVING.add(self)
        self._thread = threading.Thread(target=self._run, name="rlm-history-loop", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        name_os_thread(LOOP_THREAD_NAME)
        loop = self._loop = asyncio.new_event_loop()
        try:
            def connection() -> _ClientProtocol:  # asyncio.start_server's, with _ClientProtocol
                return _ClientProtocol(asyncio.StreamReader(limit=READER_LIMIT_BYTES, loop=loop), self._serve, loop)

            self._server = loop.run_until_complete(loop.create_server(
                connection, self.host, self.port, ssl=self.ssl_context,
                ssl_handshake_timeout=self.limits.authentication_timeout_s if self.ssl_context else None))
            self.port = self._server.sockets[0].getsockname()[1]
        except BaseException as err:  # noqa: BLE001 - reported by start()
            self._error = err
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def stop(self) -> None:
        _SERVING.discard(self)
        loop = self._loop
        if loop is None or self._thread is None:
            return

        async def _close() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            loop.stop()

        if loop.is_running():
            asyncio.run_coroutine_threadsafe(_close(), loop)
        self._thread.join(timeout=30)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --------------------------------------------------------------------------------- connections
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        CONNECTIONS.inc()
        peer = writer.get_extra_info("peername")
        ip = peer_host(peer)  # what the per-address bounds count by
        refused = self._admit(ip)
        if refused is not None:
            writer.close()
            return
        self._writers.add(writer)
        # drain() waits until the answer is wholly taken. asyncio's TLS transport pauses at size >= high (TCP's at
        # size > high): high=0 paused it with nothing queued, so drain() hung until the client sent more bytes (30 s,
        # write_timeout_ms, for a client with its next requests already pipelined: librdkafka over SASL_SSL).
        writer.transport.set_write_buffer_limits(high=1 if self.ssl_context is not None else 0)
        sock = writer.get_extra_info("socket")
        if self.limits.socket_send_buffer_bytes > 0 and sock is not None:  # what the kernel holds of an answer
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.socket_send_buffer_bytes)
        limits = self.limits
        loop = asyncio.get_running_loop()
        accepted = loop.time()
        # A session (rlm.listener.net.sasl.SaslSession) is asked before each request is served (see _answer); before
        # authentication it also bounds the frames read (max_frame_bytes).
        # As a proxy: this connection's own connection to the broker, opened at its first request (a proxy's session
        # passes SASL through on it: rlm.listener.net.sasl.PassThroughSession).
        upstream = self.router.proxy.connection() if self.router.proxy is not None else None
        if upstream is not None:
            upstream.client = writer.transport  # Fetch answers cut through (rlm.listener.upstream.relay)
        # As a proxy over plaintext, the broker's answers, once handed to the transport (which copies what its socket
        # does not take at once), give their buffer back for the next large answer (Upstream.recycle); asyncio's TLS
        # transport may keep a reference to what it was given, so over TLS each answer has a buffer of its own.
        recycled = upstream is not None and self.ssl_context is None
        session = self.session_factory(peer, upstream) if self.session_factory is not None else None
        # Who the client is, for the cluster's ACLs: its SASL user once authenticated, else its certificate's mapped
        # subject (mutual TLS), else User:ANONYMOUS. A certificate no mapping rule matches is refused, as Kafka does.
        certificate_principal = self._certificate_principal(writer, peer)
        if certificate_principal is False:
            CLOSED.labels("principal_mapping").inc()
            writer.transport.abort()
            self._release(ip)
            self._writers.discard(writer)
            return

        def client() -> Client:
            if session is not None and session.principal is not None:
                return Client(user(session.principal), ip)
            return Client(certificate_principal or ANONYMOUS, ip)

        def gone() -> bool:  # the client closed its side (or the connection broke): a long poll stops
            return writer.is_closing() or reader.at_eof()

        protocol = typing.cast(_ClientProtocol, writer.transport.get_protocol())
        protocol.vectored = vectored(writer.transport)
        task = asyncio.current_task()
        why = ""  # the bound the request being waited for is held to (idle, authentication_timeout)
        expired: list[str] = []

        def expire() -> None:  # the next request did not come in time: the task is cancelled (as asyncio.timeout)
            # its last answer not taken within the idle limit either
            expired.append("not_reading" if protocol.answer is not None else why)
            if task is not None:
                task.cancel()

        # One timer for the connection (not asyncio.timeout's per request: Deadline)
        deadline = Deadline(loop, expire)
        try:
            while True:
                # The next request must come (whole) within the idle limit and, before authentication, by the
                # authentication deadline.
                timeout, why = limits.idle_s, "idle"
                if session is not None and not session.authenticated:
                    left = accepted + limits.authentication_timeout_s - loop.time()
                    if left < timeout:
                        timeout, why = left, "authentication_timeout"
                deadline.arm(loop.time() + max(timeout, 0))
                if protocol.request_held:  # the last request is answered: its frame's room is free, as is it
                    frame = response = None
                    protocol.give_request_room()
                frame = await self._read_frame(reader, session, peer, protocol, client)
                deadline.disarm()
                if frame is None:
                    return
                # Back-pressure: a request is served once the last answer has been taken whole by the socket (a
                # client that stops taking it is closed: write_timeout_ms, idle limit; _QueuedAnswer).
                if protocol.answer is not None and not await protocol.answer.taken():
                    return
                response = await self._answer(frame, session, client, gone=gone, upstream=upstream)
                if response is None:
                    return  # the session says close (e.g. failed authentication)
                if response is NO_RESPONSE:
                    continue  # Produce with acks=0, or a long poll whose client left
                # counted before the write: a client may read the response before the next line would run
                _bytes_sent(api_label(int.from_bytes(frame[:2], "big", signed=True))).inc(len(response))
                if isinstance(response, Relayed):  # its first bytes went as they came: the rest
                    self._write(writer, protocol, response.rest(), peer, counted=len(response))
                    upstream.answered_large(len(response), peer_window(sock))  # type: ignore[union-attr]
                    if recycled:
                        upstream.recycle(response.frame)  # type: ignore[union-attr]
                elif isinstance(response, ChunkedAnswer):
                    # response.then (the proxy's next answer read ahead) once the socket has had the first writes of
                    # a small answer; before a large one's slices, whose writes mostly wait for the client to read
                    if len(response) <= WRITE_SLICE_BYTES and response.in_memory():
                        self._write(writer, protocol, response, peer)
                        if response.then is not None:
                            response.then()
                    else:
                        if response.then is not None:
                            response.then()
                        if not await self._write_chunked(writer, response, peer):
                            return
                elif len(response) <= WRITE_SLICE_BYTES:
                    self._write(writer, protocol, response, peer)  # taken, or queued (protocol.answer)
                    if upstream is not None and isinstance(response, bytearray):  # the broker's answer (a proxy's)
                        if len(response) >= RELAY_MIN_BYTES and frame[:2] == FETCH_KEY:
                            upstream.answered_large(len(response), peer_window(sock))
                        if recycled:
                            upstream.recycle(response)
                elif not await self._send(writer, response, peer, loop.time()):
                    return
                if session is not None and session.close_after_response:
                    return  # e.g. SASL_AUTHENTICATION_FAILED sent: close, as Kafka does
        except asyncio.CancelledError:
            if expired:  # else stop(): the task ends normally (asyncio's stream callback logs a cancelled task)
                CLOSED.labels(expired[0]).inc()
                log.info("history endpoint: connection closed", extra={"peer": str(peer), "reason": expired[0]})
            return
        except (ConnectionError, ssl.SSLError) as err:
            log.info("history endpoint: connection lost", extra={"peer": str(peer), "error": str(err)})
        except Exception as err:  # noqa: BLE001 - one connection's bug must not stop the server
            if session is not None and not session.authenticated:
                _unauthenticated_failure(session, err, None)
            else:
                log.exception("history endpoint: connection failed", extra={"peer": str(peer)})
        finally:
            deadline.close()
            protocol.give_request_room()
            self._raised -= protocol.raised
            protocol.raised = 0
            self._release(ip)
            self._writers.discard(writer)
            writer.close()
            if upstream is not None:
                upstream.close()

    async def _write_chunked(self, writer: asyncio.StreamWriter, answer: ChunkedAnswer, peer: Any) -> bool:
        """Write an answer carrying batches too large to hold (:mod:`rlm.listener.net.chunked`): its encoded parts,
        and each batch read from the store a chunk at a time on a worker, each chunk taken by the client (drained)
        before the next is read. False when the connection was closed: the client stopped reading, or a batch could
        not be read once part of the answer was sent (nothing else can be told then; the client retries)."""
        loop = asyncio.get_running_loop()
        held: list[bytes | memoryview] = []  # the parts in memory up to the next streamed batch: sent together
        for part in answer:
            if not isinstance(part, StreamedBatch):
                held.append(part)
                continue
            if held and not await self._send(writer, held, peer, loop.time()):
                return False
            held = []
            chunks = part.chunks()
            try:
                sent = 0
                while True:
                    try:
                        chunk = await loop.run_in_executor(self._pool, next, chunks, None)
                    except UnreadableCopyError as err:
                        log.warning("history endpoint: a large batch could not be read while it was sent, "
                                    "connection closed", extra={"peer": str(peer), "error": str(err)})
                        writer.transport.abort()
                        return False
                    if chunk is None:
                        break
                    if not await self._send(writer, chunk, peer, loop.time()):
                        return False
                    sent += len(chunk)
                if sent != len(part):
                    log.warning("history endpoint: a large batch was shorter than planned, connection closed",
                                extra={"peer": str(peer), "sent": sent, "planned": len(part)})
                    writer.transport.abort()
                    return False
            finally:
                await loop.run_in_executor(self._pool, chunks.close)
        return not held or await self._send(writer, held, peer, loop.time())

    def _certificate_principal(self, writer: asyncio.StreamWriter, peer: Any) -> str | None | bool:
        """``User:<mapped subject>`` of the client's certificate, None without one, False when no
        ``principal_mapping_rules`` entry matches it (logged)."""
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            return None
        try:
            return self.principal_mapper.principal(der)
        except (NoMatchingRuleError, ValueError) as err:
            log.warning("history endpoint: client certificate refused, connection closed "
                        "(history_listener.tls.principal_mapping_rules)", extra={"peer": str(peer), "error": str(err)})
            return False

    def _write(self, writer: asyncio.StreamWriter, protocol: _ClientProtocol,
               data: bytes | bytearray | memoryview | ChunkedAnswer, peer: Any, *, counted: int | None = None) -> None:
        """Hand an answer of at most ``WRITE_SLICE_BYTES`` to the transport whole, without waiting: what the socket
        does not take at once is the connection's queued answer (:class:`_QueuedAnswer`, counted in
        :meth:`queued_response_bytes` until the socket has taken it all), which the next request waits for. A
        consumer's next Fetch comes once it has read this answer, so it seldom waits: no event-loop round per
        answer to wake a drain, one to read the request. A :class:`ChunkedAnswer` (of parts in memory only) is
        handed over as its parts, not joined (:meth:`_write_parts`). ``counted``: the bytes the answer counts for
        when more than ``data`` (the rest of a relayed answer, whose first bytes may still be in the transport)."""
        n = len(data) if counted is None else counted
        self._queued += n
        if isinstance(data, ChunkedAnswer):
            self._write_parts(writer, protocol, data.parts)  # type: ignore[arg-type]  # in memory (the caller's check)
        else:
            writer.write(data)
        if not protocol.writing_paused:
            self._queued -= n  # the socket took it all (or the connection is gone: nothing is held either)
            return
        protocol.answer = answer = _QueuedAnswer(self, protocol, writer.transport, n, peer)
        if n > self.limits.socket_send_buffer_bytes > 0 and protocol.raised < _raised_cost(n):
            self._raise_send_buffer(writer, protocol, n)
        self._queued_answers.add(answer)
        if self._queued_ticker is None:
            self._queued_ticker = asyncio.get_running_loop().call_later(self._write_poll_s(), self._check_queued)

    @staticmethod
    def _write_parts(writer: asyncio.StreamWriter, protocol: _ClientProtocol, parts: list[bytes | memoryview]
                     ) -> None:
        """Hand ``parts`` to the connection's transport in order: over plaintext with
        :func:`~rlm.listener.net.vectored.write_parts` (one ``writev`` from the parts' own buffers; no part referenced
        once it returns), over TLS with one ``writelines`` (asyncio's TLS transport encrypts them in one pass and
        sends the ciphertext with one write; a ``write`` each encrypts and sends each apart:
        ``bench/bench_tls_parts.py``, 8 x 128 KiB 0.92 -> 0.74 CPU s/GiB, 1 x 1 MiB within noise)."""
        if protocol.vectored:
            write_parts(writer.transport, parts)
        else:
            writer.writelines(parts)

    def _raise_send_buffer(self, writer: asyncio.StreamWriter, protocol: _ClientProtocol, n: int) -> None:
        """Raise the connection's SO_SNDBUF for answers of ``n`` bytes (:func:`_raised_bytes`: half the answer,
        ``SEND_BUFFER_RAISED_BYTES`` at least, ``SEND_BUFFER_RAISED_MAX_BYTES`` at most; raised again when a larger
        answer comes; given back when it closes) if the raised buffers stay within their share of
        ``queued_max_response_bytes``, which they are counted against (:meth:`_fetch_room`): what a client that does
        not read pins in the kernel stays within the bound.

        Kafka's ``socket.send.buffer.bytes`` (100 KB) takes a 1 MiB answer about 200 KB at a time: each an
        event-loop round of the transport's (bench_history: 4.5 of 8.6 per Fetch, the endpoint CPU 1.12x of what
        it was before the issue-22 bounds, with the OS's auto-tuned buffer 0.96x). A consumer of 8 partitions gets
        ~8 MiB answers: with 1 MiB each took ~4 rounds of the event loop's, with 4 MiB 1-2 (issue 24)."""
        cost = _raised_cost(n)
        if self._raised - protocol.raised + cost > self.limits.queued_max_response_bytes // SEND_BUFFER_RAISED_SHARE:
            return
        sock = writer.get_extra_info("socket")
        if sock is None:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, cost // 2)
        except OSError:
            return
        self._raised += cost - protocol.raised
        protocol.raised = cost

    def _write_poll_s(self) -> float:
        return min(WRITE_POLL_S, self.limits.write_timeout_s)

    def _check_queued(self) -> None:
        """Every ``WRITE_POLL_S`` while answers are queued (one timer for them all, not one per answer): close the
        clients that stopped taking theirs (:meth:`_QueuedAnswer.check`)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for answer in list(self._queued_answers):
            answer.check(now)
        self._queued_ticker = (loop.call_later(self._write_poll_s(), self._check_queued) if self._queued_answers
                               else None)

    async def _send(self, writer: asyncio.StreamWriter, data: bytes | memoryview | list[bytes | memoryview],
                    peer: Any, started: float) -> bool:
        """Write ``data`` (an answer, or a part of one begun at ``started``; or such parts, in order) and wait until
        the socket has taken it all. False when the client was closed for not reading it: it took nothing for
        ``write_timeout_s``, or not the whole answer within the idle limit.

        Over plaintext, ``data`` is written from its own buffers as the socket takes it, the transport holding a
        little of it at a time (:meth:`_send_vectored`). Over TLS, it is handed to the transport a slice
        (``WRITE_SLICE_BYTES``) at a time, the next once the socket has taken the last; the loop serves others
        between slices; parts are sliced as one run of bytes, each written from its own buffer (a tier answer's
        records are not joined into one frame first: issue 24). What the socket does not take at once is copied into
        the transport's buffer: written whole, a 9 MB answer was copied there in one piece (the event
        loop held for ms, and the answer held twice, as ``data`` and as the copy, while a client did not read:
        r11's 6 clients held 2 x 159 MiB where 159 were counted). Now a transport holds at most a slice, and
        ``data`` is counted in :meth:`queued_response_bytes` until the socket has taken it. Data larger than
        ``socket_send_buffer_bytes`` raises the connection's send buffer as :meth:`_write` does (answers of several
        MiB, a consumer's of many partitions, went ~200 KB an event-loop round otherwise)."""
        parts = data if isinstance(data, list) else [data]
        n = sum(map(len, parts))
        transport = writer.transport
        protocol = typing.cast(_ClientProtocol, transport.get_protocol())
        if n > self.limits.socket_send_buffer_bytes > 0 and protocol.raised < _raised_cost(n):
            self._raise_send_buffer(writer, protocol, n)
        self._queued += n
        taken = 0
        if protocol.vectored:  # plaintext: the parts written from their own buffers as the socket takes them
            return await self._send_vectored(writer, parts, n, peer, started)
        try:
            for piece in _slices(parts, WRITE_SLICE_BYTES):
                size = sum(map(len, piece))
                self._write_parts(writer, protocol, piece)
                if transport.get_write_buffer_size():
                    if not await self._drain(writer, started):
                        CLOSED.labels("not_reading").inc()
                        log.info("history endpoint: connection closed", extra={"peer": str(peer),
                                                                                "reason": "not_reading"})
                        transport.abort()
                        return False
                elif taken + size < n:
                    await asyncio.sleep(0)  # the others' turn between slices the socket took at once
                taken += size
                self._queued -= size
            return True
        finally:
            self._queued -= n - taken  # not taken: the connection is closed (or broke)

    async def _send_vectored(self, writer: asyncio.StreamWriter, parts: list[bytes | memoryview], n: int, peer: Any,
                             started: float) -> bool:
        """:meth:`_send` over plaintext: ``parts`` (``n`` bytes, counted in :meth:`queued_response_bytes` by the
        caller) written in rounds (:func:`~rlm.listener.net.vectored.send_parts`), each as much as the socket takes
        from the parts' own buffers (a mapped block's long parts with ``sendfile``) and a little more copied into the
        transport, then drained. Handed to the transport in 2 MiB slices instead, an 8 MiB answer of a consumer of 8
        partitions was mostly copied into the transport's buffer (the socket took ~1/4 of each slice at once) and
        sent from there (issue 24). The parts stay referenced until written; the transport holds at most
        :data:`~rlm.listener.net.vectored.QUEUE_AT_MOST_BYTES` of them at a time (and never more than a slice, as
        over TLS)."""
        transport = writer.transport
        at, end = (0, 0), len(parts)
        counted = 0  # bytes of the answer no longer counted in _queued: those the socket took
        done = 0  # bytes written (taken by the socket or copied into the transport's buffer)
        try:
            while True:
                before = at
                at, _taken = send_parts(transport, parts, at, min(QUEUE_AT_MOST_BYTES, WRITE_SLICE_BYTES))
                done += _between(parts, before, at)
                took = done - transport.get_write_buffer_size() - counted
                self._queued -= took
                counted += took
                if at[0] >= end and not transport.get_write_buffer_size():
                    return True
                if transport.is_closing():
                    return False
                if not await self._drain(writer, started):
                    CLOSED.labels("not_reading").inc()
                    log.info("history endpoint: connection closed", extra={"peer": str(peer), "reason": "not_reading"})
                    transport.abort()
                    return False
        finally:
            self._queued -= n - counted  # not taken: the connection is closed (or broke)

    async def _drain(self, writer: asyncio.StreamWriter, started: float) -> bool:
        """Wait until the socket has taken what the transport holds; False when the client took nothing of it for
        ``write_timeout_s``, or not the whole answer (begun at ``started``) within the idle limit. A connection
        error is raised to the caller. One timer per poll: a task and ``asyncio.wait`` per drain cost several
        loop rounds per answer. For the slices of answers above ``WRITE_SLICE_BYTES`` and the parts of chunked
        ones: smaller answers are not waited for (:meth:`_write`)."""
        loop = asyncio.get_running_loop()
        transport = writer.transport
        progressed = loop.time()
        queued = transport.get_write_buffer_size()
        poll = min(WRITE_POLL_S, self.limits.write_timeout_s)
        while True:
            try:
                async with asyncio.timeout(poll):
                    await writer.drain()
                return True
            except TimeoutError:
                pass
            now, left = loop.time(), transport.get_write_buffer_size()
            if left < queued:
                queued, progressed = left, now
            if now - progressed >= self.limits.write_timeout_s or now - started >= self.limits.idle_s:
                return False

    def queued_response_bytes(self) -> int:
        """Answer bytes queued to clients now, not yet taken by their sockets (on the event loop only): a running
        total kept by :meth:`_send`, O(1)."""
        return self._queued

    def _fetch_room(self) -> int:
        """What is left of ``queued_max_response_bytes`` for the next Fetch answer (on the event loop only)."""
        return max(self.limits.queued_max_response_bytes - self._queued - self._reserved - self._raised, 0)

    def _admit(self, ip: str) -> str | None:
        """Count a new connection from ``ip`` in, or say why it is refused (it is closed at once, as Kafka closes
        connections past max.connections.per.ip). Runs on the event loop: no lock."""
        limits = self.limits
        if self._open >= limits.max_connections:
            reason = "max_connections"
        elif self._per_ip.get(ip, 0) >= limits.max_connections_per_ip:
            reason = "max_connections_per_ip"
        else:
            self._open += 1
            self._per_ip[ip] = self._per_ip.get(ip, 0) + 1
            return None
        self._refuse(reason, ip, {"max_connections": limits.max_connections,
                                  "max_connections_per_ip": limits.max_connections_per_ip})
        return reason

    def _refuse(self, reason: str, peer: str, extra: dict[str, Any]) -> None:
        """Count a connection closed for a bound, and log it at most once a minute per bound (not a line a socket)."""
        CLOSED.labels(reason).inc()
        now = time.monotonic()
        if now - self._refusal_logged.get(reason, -math.inf) >= REFUSAL_LOG_INTERVAL_S:
            self._refusal_logged[reason] = now
            log.warning("history endpoint: a connection bound was reached, connections are closed (logged once a "
                        "minute, counted in rlm_history_closed_connections)",
                        extra={"peer": peer, "reason": reason, **extra})

    def _release(self, ip: str) -> None:
        self._open -= 1
        n = self._per_ip.get(ip, 0) - 1
        if n > 0:
            self._per_ip[ip] = n
        else:
            self._per_ip.pop(ip, None)

    async def _read_frame(self, reader: asyncio.StreamReader, session: Any, peer: Any,
                          protocol: _ClientProtocol, client: Callable[[], Client]) -> bytes | memoryview | None:
        """The next request frame (without its size), or None when the connection is to be closed. A frame over
        ``READ_SLICE_BYTES`` is a read-only view (:func:`_read_large`), read only once the connection's last answer
        has been taken (``protocol.answer``): a client that does not read cannot make the server hold a large
        request beside its answer (a small one is in the stream's buffer already). A frame over
        ``READER_LIMIT_BYTES`` is read once it has its room of ``queued_max_request_bytes`` (``protocol.request_held``
        until it is answered; ``client()`` names who holds it): before authentication none is waited for, the
        connection is closed."""
        try:
            size_bytes = await reader.readexactly(SIZE.size)
        except asyncio.IncompleteReadError:
            return None  # the client closed
        (size,) = SIZE.unpack(size_bytes)
        limit = self.limits.request_max_bytes
        pre_auth = getattr(session, "max_frame_bytes", None)  # before SASL authentication: smaller still
        if pre_auth is not None:
            limit = min(limit, pre_auth)
        if size < 10 or size > limit:
            BAD.labels("frame_size").inc()
            log.warning("history endpoint: not a Kafka request frame, connection closed",
                        extra={"peer": str(peer), "size": size})
            return None
        if size > READER_LIMIT_BYTES:
            owner = _owners(client())  # an address, a principal, holds half a room at most
            if pre_auth is not None:  # a stranger takes from strangers' room only, and neither waits nor queues
                room = self.pre_auth_requests
                if not room.try_take(size, owner):
                    self._refuse("request_memory", str(peer), {"size": size})
                    return None
            else:
                room = self.requests
                if not room.try_take(size, owner):
                    await room.take(size, owner)  # the connection's idle deadline bounds the wait
            protocol.request_room, protocol.request_held, protocol.request_owner = room, size, owner
        try:
            if size <= READ_SLICE_BYTES:
                return await reader.readexactly(size)
            if protocol is not None and protocol.answer is not None and not await protocol.answer.taken():
                return None
            return await _read_large(reader, size)
        except asyncio.IncompleteReadError:
            BAD.labels("truncated_frame").inc()
            return None

    async def _answer(self, frame: bytes | memoryview, session: Any, client: Callable[[], Client], *,
                      gone: Callable[[], bool] | None = None, upstream: Upstream | None = None) -> bytes | None:
        started = time.monotonic()
        if upstream is not None and not isinstance(frame, bytes):
            frame = bytes(frame)  # a proxy forwards the frame's bytes (rlm.listener.upstream)
        try:
            header = read_header(frame)
        except BadRequestError as err:
            BAD.labels("header").inc()
            log.warning("history endpoint: unreadable request header", extra={"error": str(err)})
            if err.header is None:
                return None
            header = err.header
        api = api_label(header.api_key)  # a closed set: the client chooses the key
        error = "none"
        try:
            offered = self.router.offered
            if upstream is not None:  # a proxy offers by the broker's versions, asked when its connection opens
                try:
                    await upstream.ready()
                except UpstreamError as err:
                    error = "upstream"
                    log.warning("proxy: the broker cannot be reached, client connection closed",
                                extra={"error": str(err)})
                    return None
                offered = upstream.offered
                if offered is None:
                    offered = upstream.offered = self.router.versions(upstream.versions)
            lo_hi = offered.get(header.api_key)
            if header.api_key == ApiKey.API_VERSIONS and (lo_hi is None or not lo_hi[0] <= header.api_version
                                                          <= lo_hi[1]):
                # Answer at v0 so that any client can read which versions are offered (Kafka's rule).
                from kio.schema.api_versions.v0.response import ApiVersionsResponse
                error = "unsupported_version"
                body = build(ApiVersionsResponse, self.router.api_versions(
                    ErrorCode.unsupported_version, broker=upstream.broker_api_versions if upstream else None))
                return encode_response(header._replace(flexible=False), body)
            if session is not None:
                # SASL: None serves the request; bytes are the answer instead; b"" closes without one.
                try:
                    gate = await session.gate(self, header, frame)
                except Exception as err:  # noqa: BLE001 - a bug here must not let a stranger write tracebacks
                    error = "internal"
                    _unauthenticated_failure(session, err, header)
                    return None
                if gate is not None:
                    return gate if gate else None
            if lo_hi is None or not lo_hi[0] <= header.api_version <= lo_hi[1]:
                error = "unsupported_version"
                BAD.labels("unsupported_version").inc()
                return self._error_response(header, ErrorCode.unsupported_version)
            if upstream is not None and self.router.route(header.api_key) in (Route.FORWARD, Route.REWRITE):
                return await self._proxied(header, frame, None, client(), upstream)  # bytes, not decoded
            if len(frame) <= INLINE_FRAME_BYTES:
                try:
                    req = decode_request(frame, header)
                except BadRequestError as err:
                    error = "invalid_request"
                    return self._bad_body(header, api, err)
                return await self._dispatch(header, req, client(), gone, frame, upstream)
            # A large body is decoded on a worker, not on the event loop. Its objects (a
            # kio entity per partition, then the answer's) would make the cyclic GC run full collections of the
            # growing heap, each holding the GIL, so the event loop, for up to hundreds of ms: the GC is held off
            # until the answer is made (GC_PAUSE).
            # Decoded an array item at a time (kio's native reader would hold the GIL for the whole frame), the items
            # also held in ``keep`` so that dropping the request only lowers their counts; then ``keep`` is freed a
            # slice at a time (one deallocation of them all would hold the GIL for tens of ms).
            keep: list[Any] = []
            with GC_PAUSE.held():
                try:
                    req = await asyncio.get_running_loop().run_in_executor(
                        self._pool, functools.partial(decode_request, frame, header, keep=keep))
                except BadRequestError as err:
                    error = "invalid_request"
                    await asyncio.get_running_loop().run_in_executor(self._pool, free_gradually, keep)
                    return self._bad_body(header, api, err)
                response = await self._dispatch(header, req, client(), gone, frame, upstream)
                del req  # the items are freed before the GC runs again (kio entities hold no cycles)
                # The answer is held against queued_max_response_bytes meanwhile (a Fetch's reservation ended with
                # it; _send counts it from its first write on): else that bound would not count it for as long as
                # the request's items take to free (tens of ms for 300,000 partitions).
                held = len(response) if response else 0
                self._queued += held
                try:
                    await asyncio.get_running_loop().run_in_executor(self._pool, free_gradually, keep)
                finally:
                    self._queued -= held
                return response
        finally:
            _requests(api, error).inc()
            _latency(api).observe(time.monotonic() - started)

    def _bad_body(self, header: RequestHeader, api: str, err: BadRequestError) -> bytes:
        BAD.labels("body").inc()
        log.warning("history endpoint: request does not decode", extra={"error": str(err), "api": api})
        return self._error_response(header, ErrorCode.invalid_request)

    def _error_response(self, header: RequestHeader, code: ErrorCode) -> bytes:
        rtype = response_type(header)
        if rtype is None:
            return encode_response(header, None, raw_error=code.value)
        return encode_response(header, error_body(rtype, code))

    async def _dispatch(self, header: RequestHeader, req: Any, client: Client,
                        gone: Callable[[], bool] | None = None, frame: bytes | memoryview = b"",
                        upstream: Upstream | None = None) -> bytes | None:
        """The encoded response (or NO_RESPONSE). Only ApiVersions is answered on the event loop: every other
        handler, and the build and encoding of its answer (proportional to the request or the records), runs on a
        worker, so that one connection's large request never holds the others."""
        loop = asyncio.get_running_loop()
        rtype = response_type(header)
        key = header.api_key
        if key == ApiKey.API_VERSIONS:
            return encode_response(header, build(rtype, self.router.api_versions(
                broker=upstream.broker_api_versions if upstream else None)))
        if upstream is not None:  # the frame is bytes then (_answer)
            return await self._proxied(header, typing.cast(bytes, frame), req, client, upstream)
        if key == ApiKey.FETCH:
            return await self._fetch(header, rtype, req, client, gone)
        call = self.router.answer(key)

        def answer() -> bytes:
            values = call(req, client)
            return NO_RESPONSE if values is None else _encoded(header, rtype, values)

        return await loop.run_in_executor(self._pool, answer)

    async def _proxied(self, header: RequestHeader, frame: bytes, req: Any, client: Client, upstream: Upstream
                       ) -> bytes | None:
        """A proxied route's answer (:mod:`rlm.listener.upstream.proxy`); None closes the client's connection: the
        broker's failed (or its answer did not decode), as a client loses its connection when a broker goes, or the
        client's requests may not be forwarded (:mod:`rlm.listener.upstream.hosts`)."""
        # Not forwarded for a client whose requests the broker would judge by the proxy's address (host-based ACLs,
        # rlm.listener.upstream.hosts): closed, counted and logged there.
        if self.router.proxy.hosts.refused(client.principal, client.host, upstream) is not None:
            upstream.close()
            return None
        # A Fetch's tier reads hold their room while they run, as the listener's own Fetch's do (_fetch): else
        # concurrent proxied Fetches each saw all of it and together read past queued_max_response_bytes.
        room = _FetchRoom(self, req) if header.api_key == ApiKey.FETCH and req is not None else self._fetch_room
        try:
            answer = await self.router.proxy.answer(self.router.route(header.api_key), header, frame, req, client,
                                                    upstream, self._workers, room)
        except (UpstreamError, BadRequestError) as err:
            log.warning("proxy: the broker's connection failed, client connection closed",
                        extra={"api_key": header.api_key, "error": str(err)})
            upstream.close()
            return None
        finally:
            if isinstance(room, _FetchRoom):
                room.release()  # the caller queues the answer with no await in between: counted there from then on
        return answer if answer else NO_RESPONSE

    async def _fetch(self, header: RequestHeader, rtype: type, req: Any, client: Client,
                     gone: Callable[[], bool] | None = None) -> bytes:
        loop = asyncio.get_running_loop()
        max_wait_s = min(max(_millis(req.max_wait), 0) / 1000, self.limits.fetch_max_wait_s)
        deadline = loop.time() + max_wait_s
        router = self.router
        ctx = router.ctx
        may_wait = max_wait_s > 0 and req.min_bytes > 0

        def fetch(budget: int, first: bool, last: dict[str, Any] | None = None
                  ) -> tuple[Any, int, bool, frozenset[Any], dict[Any, Mark]]:
            """(the answer encoded when it is final, else its values; record bytes; final; partitions a poll
            waits on, their bounds)"""
            if last is not None:
                free_gradually(last)  # the last run's answer: freed here, not on the event loop
            # The bounds are read before the fetch: a segment tiered in between makes the next tick re-run it (once
            # more than needed), never miss it. The first run also names the partitions a poll would wait on (only
            # a Fetch that may wait: a consumer's max_wait 0 or min_bytes 0 costs nothing more).
            if not may_wait:
                tps, marks = frozenset(), {}
            else:
                tps = frozenset(self._fetched(req)) if first else pending.tps  # type: ignore[union-attr]
                marks = tier_marks(ctx.tier, tps)
            values, size = router.fetch(req, client, budget=budget)
            # Kafka's DelayedFetch answers at once when nothing is asked for, or on an error (or min_bytes, below).
            now = not any(t.partitions for t in req.topics) or _has_error(values)
            if size >= req.min_bytes or now or loop.time() >= deadline:
                return answer(values), size, True, tps, marks  # answered: encoded in the same worker job
            return values, size, False, tps, marks

        def answer(values: dict[str, Any]) -> bytes:
            for t in values["responses"]:
                n = sum(len(p["records"]) for p in t["partitions"])
                if n:
                    RECORD_BYTES.labels(t["topic"] or str(t["topic_id"])).inc(n)
            return _encoded(header, rtype, values, fetch=True)

        pending: PendingFetch | None = None
        # this answer's bytes, held against queued_max_response_bytes until it is queued (by the caller)
        lease = _FetchRoom(self, req)
        try:
            while True:
                # The answer's record budget is what is left of the bound on queued answers (clients that do not
                # read cannot make the sidecar hold more); while the tier is read, the answer holds of it what its
                # partitions can bring (not all of max_bytes: concurrent Fetches found no room left and got a batch).
                room = lease(min(ctx.fetch_max_bytes, req.max_bytes if req.max_bytes > 0 else ctx.fetch_max_bytes))
                if pending is None:
                    values, size, final, tps, marks = await loop.run_in_executor(self._pool, fetch, room, True)
                else:
                    async with self._rerun_slots:  # waiting polls never take more than half of the workers
                        values, size, final, tps, marks = await loop.run_in_executor(self._pool, fetch, room, False,
                                                                                     values)
                lease.hold(size)
                if final:
                    # Released on return: the caller queues the answer with no await in between (then it is
                    # counted in its transport's buffer).
                    return typing.cast(bytes, values)
                if pending and pending.expired:
                    break
                if pending is None:
                    pending = PendingFetch(tps, deadline, req.min_bytes, gone or _never, marks,
                                           loop.create_future())
                    self._polls.add(pending)
                else:
                    pending.seen, pending.woken = marks, loop.create_future()
                woke = await pending.woken
                if woke == GONE:
                    return NO_RESPONSE  # the client left: the poll ends with its connection (as Kafka drops it)
                if woke == EXPIRED:
                    break  # answered with what it had: the tier did not change since (else it was woken GROWN)
            if pending is not None:
                self._polls.discard(pending)
            return await loop.run_in_executor(self._pool, answer, values)  # expired with what it had
        finally:
            lease.release()
            if pending is not None:
                self._polls.discard(pending)

    def _fetched(self, req: Any) -> list[Any]:
        out = []
        for t in req.topics:
            name, tid = getattr(t, "topic", None), getattr(t, "topic_id", None)
            catalog = self.router.ctx.catalog
            topic = catalog.by_name(name) if name is not None else catalog.by_id(tid)
            if topic is not None:
                out.extend(topic.tp(p.partition) for p in t.partitions if p.partition in topic.partitions)
        return out


async def _read_large(reader: asyncio.StreamReader, size: int) -> memoryview:
    """The next ``size`` bytes of the stream, taken a slice (``READ_SLICE_BYTES``) at a time into an anonymous
    mapping: a read-only view of it (kio reads views; bytes fields are decoded as bytes). ``readexactly`` of a 4.8 MB
    frame let the stream's buffer grow to the whole frame (its flow control is off while it waits), then copied it
    out in one piece on the event loop; joined into one bytes object, the frame's pages were still faulted in at
    once (3-4 ms for 4.8 MB on a loaded machine, in proportion to size). A mapping's pages are faulted in as each
    slice is written: no callback holds the loop for more than a slice."""
    buf = mmap.mmap(-1, size)
    pos = 0
    while pos < size:
        part = await reader.read(min(size - pos, READ_SLICE_BYTES))
        if not part:
            raise asyncio.IncompleteReadError(b"", size)
        buf[pos:pos + len(part)] = part
        pos += len(part)
    return memoryview(buf).toreadonly()


class _Workers:
    """The listener's worker pool as :class:`rlm.listener.upstream.proxy.Run`: ``workers(fn, *args)`` is awaited on
    the running event loop; ``workers.submit(fn, *args)`` is not (its completion wakes no loop)."""

    __slots__ = ("_pool", "submit")

    def __init__(self, pool: concurrent.futures.ThreadPoolExecutor) -> None:
        self._pool = pool
        self.submit = pool.submit

    def __call__(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)


def _owners(client: Client) -> Owners:
    """Who a request frame is held for in its room (each holds a share at most): the client's address, and its
    principal unless anonymous (every client of a listener without authentication is)."""
    return (client.host,) if client.principal == ANONYMOUS else (client.host, client.principal)


class _ClientProtocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol for a client connection, which also tells when the socket has taken all that was
    written (``resume_writing``; the transport's high-water mark is 0, or 1 with TLS: see ``_serve``) to the
    connection's queued answer (``answer``), and whether writing is paused now (something is left to take)."""

    def __init__(self, reader: asyncio.StreamReader, serve: Callable[..., Any], loop: asyncio.AbstractEventLoop
                 ) -> None:
        super().__init__(reader, serve, loop=loop)
        self.answer: _QueuedAnswer | None = None  # an answer written and not yet all taken by the socket
        self.writing_paused = False
        self.raised = 0  # kernel send-buffer bytes counted for this connection (ListenerServer._raise_send_buffer)
        self.request_held = 0  # bytes of queued_max_request_bytes its request being served holds (_read_frame)
        self.request_room: RequestRoom | None = None  # the room they are held in (strangers have their own)
        self.request_owner: Owners = ()  # whom they are held for (RequestRoom's share per address and principal)
        self.vectored = False  # plaintext: answers in parts are written with one writev (rlm.listener.net.vectored)

    def give_request_room(self) -> None:
        """The request served is answered (or the connection gone): what its frame held of its room given back."""
        if self.request_held and self.request_room is not None:
            self.request_room.give(self.request_held, self.request_owner)
        self.request_held, self.request_room = 0, None

    def pause_writing(self) -> None:
        super().pause_writing()
        self.writing_paused = True

    def resume_writing(self) -> None:
        super().resume_writing()
        self.writing_paused = False
        if self.answer is not None:
            self.answer.finish(True)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.answer is not None:
            self.answer.finish(False)
        super().connection_lost(exc)


class _QueuedAnswer:
    """An answer handed whole to a connection's transport (:meth:`ListenerServer._write`) that its socket has not
    taken all of yet: counted in the server's queued bytes until it has (the protocol's ``resume_writing``) or the
    connection is gone. The server checks its progress every ``WRITE_POLL_S``: a client that took nothing of it for
    ``write_timeout_s``, or not all of it within the idle limit, is closed (``not_reading``), as by
    :meth:`ListenerServer._drain`. The next request waits for it (:meth:`taken`)."""

    __slots__ = ("_done", "_left", "_nbytes", "_peer", "_progressed", "_protocol", "_server", "_started",
                 "_transport", "_waiter")

    def __init__(self, server: ListenerServer, protocol: _ClientProtocol, transport: asyncio.WriteTransport,
                 nbytes: int, peer: Any) -> None:
        loop = asyncio.get_running_loop()
        self._server, self._protocol, self._transport, self._nbytes, self._peer = (server, protocol, transport,
                                                                                  nbytes, peer)
        self._started = self._progressed = loop.time()
        self._left = transport.get_write_buffer_size()
        self._done: bool | None = None  # taken (True), the connection closed or lost (False); None: not yet
        self._waiter: asyncio.Future[bool] | None = None

    def finish(self, taken: bool) -> None:
        """The socket took it all (``taken``), or the connection is closed: it is no longer queued."""
        if self._done is not None:
            return
        self._done = taken
        self._server._queued -= self._nbytes
        self._server._queued_answers.discard(self)
        if self._protocol.answer is self:
            self._protocol.answer = None
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(taken)

    async def taken(self) -> bool:
        """Once the socket has taken it all: True; False when the connection was closed first."""
        if self._done is None:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return bool(self._done)

    def check(self, now: float) -> None:
        """Close the connection when its client stopped taking the answer (``not_reading``)."""
        if self._done is not None:
            return
        limits = self._server.limits
        left = self._transport.get_write_buffer_size()
        if left < self._left:
            self._left, self._progressed = left, now
        if now - self._progressed >= limits.write_timeout_s or now - self._started >= limits.idle_s:
            CLOSED.labels("not_reading").inc()
            log.info("history endpoint: connection closed", extra={"peer": str(self._peer), "reason": "not_reading"})
            self.finish(False)
            self._transport.abort()


@functools.cache
def _requests(api: str, error: str) -> Any:
    """A child of :data:`REQUESTS` (looked up once per label set: both labels are of closed sets)."""
    return REQUESTS.labels(api, error)


@functools.cache
def _latency(api: str) -> Any:
    return LATENCY.labels(api)


@functools.cache
def _bytes_sent(api: str) -> Any:
    return BYTES_SENT.labels(api)


def steady_malloc(threshold_bytes: int = MALLOC_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap and trim thresholds at ``threshold_bytes`` (process-wide); False where there is no glibc.

    Each Fetch answer makes buffers of about its size (the records read, the encoded answer): a consumer's are 1 MiB.
    Made and freed on the worker threads, they live in per-thread malloc arenas, and glibc's dynamic thresholds
    (mmap past 128 KiB, raised to the largest chunk freed; trim past twice that) returned them to the kernel at each
    free, so each answer page-faulted its buffers in again, zero-filled: a stub tier's 1 MiB Fetch cost 1.0-1.4 ms
    of CPU instead of 0.6-0.7 (the same answer before the listener encoded on workers: 0.55-0.7), 150 times the
    page faults. Fixed thresholds keep up to ``threshold_bytes`` free at the top of each arena (what a couple of
    answers of 1 MiB need) and allocate larger buffers with mmap as before."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, threshold_bytes)) and bool(mallopt(M_TRIM_THRESHOLD, threshold_bytes))


def name_os_thread(name: str) -> bool:
    """Give the calling thread ``name`` (its first 15 bytes) as the OS shows it (Python 3.11 names none: every
    thread is ``python`` in ``top -H`` and ``/proc/<pid>/task/*/comm``), so that the listener's event loop and
    workers can be told apart by their CPU; False where there is no ``prctl``."""
    try:
        prctl = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return False
    return prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0) == 0


class GcPause:
    """The cyclic garbage collector held off while large requests are worked on (thread-safe; held while any is).

    A request of 300,000 Fetch partitions makes several tracked objects per partition (its kio entity, the answer's
    values and entity) within seconds: the heap grows by a quarter several times over, and each time the GC runs a
    full collection of all of it, holding the GIL throughout (measured with r8: eight of them, 30 to 173 ms each on
    a quiet machine), so the event loop answers nobody meanwhile. Those objects hold no reference cycles: their
    refcounts free them once the answer is made. The GC is enabled again when the last large request is answered,
    and once it has been held off ``max_s`` in a row a new large request no longer holds it (clients sending large
    requests back to back cannot keep it off: other cyclic garbage is collected at least that often). The GC is left
    alone when something else disabled it.

    Meanwhile the interpreter's switch interval is lowered to ``switch_interval_s`` (1 ms; Python's default 5 ms):
    with a worker running Python, the event loop waits up to one interval each time it takes the GIL back after a
    system call, and a round trip makes several (r8 on a quiet machine, ApiVersions during the 300,000-partition
    Fetch: p99 11.5-13.8 ms, worst 13.7-20 ms at 5 ms; p99 3.5-3.8 ms, worst 7.9-12.5 ms at 1 ms). Restored once no
    large request is worked on."""

    def __init__(self, max_s: float = GC_PAUSE_MAX_S, switch_interval_s: float = LARGE_REQUEST_SWITCH_INTERVAL_S
                 ) -> None:
        self.max_s = max_s
        self.switch_interval_s = switch_interval_s
        self._lock = threading.Lock()
        self._holders = 0
        self._since: float | None = None  # when we disabled the GC (None: we did not)
        self._switch_interval: float | None = None  # the interpreter's, while we lowered it

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            now = time.monotonic()
            if self._holders == 0 and self._since is None and gc.isenabled():
                gc.disable()
                self._since = now
            elif self._since is not None and now - self._since > self.max_s:
                gc.enable()  # held off long enough: the GC runs again until no large request is worked on
                self._since = None
            if self._holders == 0 and sys.getswitchinterval() > self.switch_interval_s:
                self._switch_interval = sys.getswitchinterval()
                sys.setswitchinterval(self.switch_interval_s)
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0 and self._since is not None:
                    gc.enable()
                    self._since = None
                if self._holders == 0 and self._switch_interval is not None:
                    sys.setswitchinterval(self._switch_interval)
                    self._switch_interval = None


GC_PAUSE = GcPause()


def _unauthenticated_failure(session: Any, err: Exception, header: RequestHeader | None) -> None:
    """An unexpected error while serving a connection that has not authenticated: the connection is closed and
    the error logged as a WARNING line without its traceback (anyone who can connect could otherwise fill the log
    with ERROR tracebacks); the traceback goes to DEBUG, for whoever debugs the endpoint."""
    BAD.labels("internal").inc()
    extra = {"peer": str(getattr(session, "peer", None)), "error": f"{type(err).__name__}: {err}"}
    if header is not None:
        extra.update(api_key=header.api_key, api_version=header.api_version)
    log.warning("history endpoint: request before authentication failed, connection closed", extra=extra)
    log.debug("history endpoint: request before authentication failed", exc_info=err, extra=extra)


def _encoded(header: RequestHeader, rtype: type, values: dict[str, Any], *, fetch: bool = False) -> bytes:
    """The answer of ``values`` encoded; then the values and the entity built from them are freed a slice at a time
    on this (worker) thread: freed in one piece, the answer of a Fetch of 300,000 partitions holds the GIL (so the
    event loop) for tens of ms. An answer of at most ``FREE_WHOLE_STRUCTS`` structs (a consumer's: a few partitions)
    is dropped whole: microseconds."""
    keep: list[Any] = []

    def encode(v: dict[str, Any]) -> bytes:
        return encode_response(header, build(rtype, v, keep))  # the entity, dropped on return, only lowers counts

    # a Fetch answer may carry a batch too large to hold: written later, in chunks (rlm.listener.net.chunked)
    data = encode_streamed(values, encode, flexible=header.flexible) if fetch else encode(values)
    if len(keep) > FREE_WHOLE_STRUCTS:
        free_gradually(values)
        free_gradually(keep)
    return data  # type: ignore[return-value]


def _raised_cost(n: int) -> int:
    """The kernel bytes a connection's send buffer raised for answers of ``n`` bytes holds (Linux doubles SO_SNDBUF
    for its bookkeeping): half the answer, within ``SEND_BUFFER_RAISED_BYTES`` .. ``SEND_BUFFER_RAISED_MAX_BYTES``."""
    return 2 * min(max(n // 2, SEND_BUFFER_RAISED_BYTES), max(SEND_BUFFER_RAISED_MAX_BYTES, SEND_BUFFER_RAISED_BYTES))


def _between(parts: list[bytes | memoryview], start: tuple[int, int], end: tuple[int, int]) -> int:
    """The bytes of ``parts`` from position ``start`` to ``end`` ((part index, bytes into it))."""
    (i, a), (j, b) = start, end
    if i == j:
        return b - a
    return len(parts[i]) - a + sum(len(parts[k]) for k in range(i + 1, min(j, len(parts)))) + b


def _slices(parts: list[bytes | memoryview], limit: int) -> Iterator[list[bytes | memoryview]]:
    """``parts`` cut into runs of at most ``limit`` bytes (a part longer than what is left of a run is cut: views,
    not copies), in order."""
    run: list[bytes | memoryview] = []
    room = limit
    for part in parts:
        pos, n = 0, len(part)
        while pos < n:
            take = min(room, n - pos)
            run.append(part if take == n else memoryview(part)[pos:pos + take])
            pos += take
            room -= take
            if not room:
                yield run
                run, room = [], limit
    if run:
        yield run


class _FetchRoom:
    """The room of a Fetch's tier reads, the listener's own (:meth:`ListenerServer._fetch`) and a proxied one's (the
    proxy's ``room``): each look, taken before a read of the tier, gives what is left of ``queued_max_response_bytes``
    (within ``cap``) and holds of it, until the next look, :meth:`hold` or :meth:`release`, what the Fetch's partitions
    can bring (:func:`_most_records`). On the event loop only (as ``_reserved``)."""

    __slots__ = ("held", "most", "server")

    def __init__(self, server: ListenerServer, req: Any) -> None:
        self.server, self.most, self.held = server, _most_records(req), 0

    def __call__(self, cap: int | None = None) -> int:
        server = self.server
        server._reserved -= self.held
        room = server._fetch_room() if cap is None else min(server._fetch_room(), cap)
        self.held = room if self.most is None else min(room, self.most)
        server._reserved += self.held
        return room

    def hold(self, n: int) -> None:
        """Hold ``n`` bytes instead (the answer read: its size, until it is queued)."""
        self.server._reserved += n - self.held
        self.held = n

    def release(self) -> None:
        self.server._reserved -= self.held
        self.held = 0


def _most_records(req: Any) -> int | None:
    """The most record bytes a Fetch's partitions can bring: the sum of their ``partition_max_bytes`` (a partition
    listed twice counted twice), the first batch past its partition's room aside (Kafka's rule: that overshoot is
    the "plus a batch" of the queued bound). None for more than :data:`MOST_RECORDS_PARTITIONS` partitions: not
    summed on the event loop."""
    if sum(len(t.partitions) for t in req.topics) > MOST_RECORDS_PARTITIONS:
        return None
    return sum(max(p.partition_max_bytes, 0) for t in req.topics for p in t.partitions)


def _never() -> bool:
    return False


def _has_error(values: dict[str, Any]) -> bool:
    return any(p["error_code"] != ErrorCode.none for t in values["responses"] for p in t["partitions"])


def _millis(value: Any) -> float:
    return value.total_seconds() * 1000 if hasattr(value, "total_seconds") else float(value)
