"""Cut-through of a broker's Fetch answer to the client: its bytes sent on as they come, not once it is whole.

A proxied Fetch answer that needs no change (no partition the tier must answer, no leader's address to rewrite) is
the broker's bytes. Stored whole before it is sent, a 1 MiB answer crosses the proxy in two steps, one after the
other: the broker's transfer into the proxy's buffer, then the proxy's to the client; a consumer has one Fetch in
flight per broker, so both are in every Fetch's time (bench_proxy's live read: one Fetch every 2.24-2.85 ms through
the proxy against 1.79 ms from the broker, session 22). Relayed, the client gets the answer's first bytes as soon as
the proxy does, and the two transfers overlap.

It pays only where the client's path paces the answer: a client whose receive window is smaller than an answer (the
Java consumer's ``receive.buffer.bytes`` is 64 KiB) takes it a window at a time, stored whole or not, and that
transfer could have begun with the broker's. A client that takes a 1 MiB answer at once (librdkafka's window, grown
by the kernel's autotuning, on loopback) gains nothing from it, and each piece sent early is another wake-up of the
client and of the broker's sending thread: on the 2-core bench machine, relayed pieces took the consumer 0.3-0.4 and
the broker 0.15-0.2 more CPU s/GiB, and librdkafka's live read went from 0.86-0.97x of direct to 0.72-0.79x while the
Java consumer's went from 0.65-0.70x to 0.78-1.04x (``bench_proxy --live-only --client both``, session 23). So an
answer is relayed when the largest receive window the client has advertised (:func:`peer_window`, read after each
large answer) is smaller than the last large answer, and in pieces of at least ``RELAY_MIN_BYTES``; an answer smaller
than that is stored whole. (The kernel's count of the bytes a socket could not send yet, tried first, also counted a
librdkafka whose process the loaded machine had not run for a moment: it relayed 20-29% of librdkafka's answers.)
A client behind a network slower than loopback with a large window is not relayed: the broker's loopback transfer it
would overlap is the short one.

What may go before the answer is whole is what cannot change whatever its rest holds: an answer of one topic of one
partition with records and no error, top-level or the partition's, up to its records' end
(:func:`~rlm.listener.protocol.codec.fetch_records_end`, read from its first bytes). Its rest (the partition's, the
topic's and the answer's tagged fields: a leader's address is only named for a partition answered with an error) is
held until the answer is whole, walked as every answer is (:func:`~rlm.listener.protocol.codec.fetch_answer`), and
sent by the listener. An answer of several partitions is stored whole as before: a later partition's error
(OFFSET_OUT_OF_RANGE below the log start, for the tier to answer) comes after the earlier ones' records, and the
answer's size, sent first, would change.

A relayed answer that its walk finds must change after all (no broker answers so) or cannot walk (a malformed
answer), or whose broker connection fails before it is whole, cannot be taken back: the client's connection is reset
(:meth:`Relay.abort`: its queued bytes dropped, RST; counted, ``rlm_history_proxy_relayed_answers_total{result}``,
and logged with the broker and the reason) and the client fetches again on a new one, as after losing a broker.
Closed gracefully instead, the client would first be given the rest of what was queued for it. A client that leaves
mid-answer is written no more (:meth:`Relay.advance`: asyncio logs each write to a lost connection from the fifth
on), counted as ``closed``.
"""

from __future__ import annotations

import asyncio
import socket
import struct

from prometheus_client import Counter

from rlm.listener.protocol.codec import fetch_records_end
from rlm.listener.protocol.frame import CORRELATION_ID, SIZE, RequestHeader
from rlm.logs import limited_logger

__all__ = ["RELAY_MIN_BYTES", "Relay", "Relayed", "peer_window"]

log = limited_logger(__name__)

RELAYED = Counter("rlm_history_proxy_relayed_answers", "As a proxy: the broker's Fetch answers sent on to the client "
                  "as they came (cut-through), by how they ended: sent; aborted (the client's connection reset: the "
                  "broker's failed, or the answer did not walk or needed a change once whole); closed (the client's "
                  "connection closed before the answer was whole)", ["result"])
_SENT, _ABORTED, _CLOSED = RELAYED.labels("sent"), RELAYED.labels("aborted"), RELAYED.labels("closed")
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection
_UNDECIDED, _DECLINED = 0, -1
# What comes is sent on once this much has gathered (or the records' end has come): a send each time the broker's
# bytes are read (~100-200 KB at a time) took more CPU of the proxy and the consumer than the overlap saved.
RELAY_MIN_BYTES = 256 * 1024
# struct tcp_info (linux/tcp.h): tcpi_snd_wnd, the peer's advertised receive window after scaling (Linux 5.4+)
_TCP_INFO_BYTES = 232
_SND_WND = struct.Struct("=I")
_SND_WND_AT = 228


def peer_window(sock: socket.socket | None) -> int | None:
    """The receive window the client on ``sock`` advertises now (bytes; the kernel's ``TCP_INFO``), None where it
    cannot be asked. Its largest so far tells a client that can take an answer at once (the kernel's autotuning grows
    librdkafka's to MiBs within a few answers) from one that takes it a window at a time (the Java consumer's 64 KiB
    ``receive.buffer.bytes``: ~95 KB on loopback, for good)."""
    if sock is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
    except (OSError, AttributeError):
        return None
    return _SND_WND.unpack_from(info, _SND_WND_AT)[0] if len(info) >= _TCP_INFO_BYTES else None


class Relay:
    """One Fetch answer's cut-through to the client's ``transport``, fed by the broker's connection as the answer's
    bytes land in its buffer (:meth:`advance`; on the event loop)."""

    __slots__ = ("_header", "_until", "client_id", "sent", "transport", "upstream_id")

    def __init__(self, transport: asyncio.WriteTransport, header: RequestHeader) -> None:
        self.transport = transport
        self._header = header
        self.client_id = header.correlation_id  # the answer goes with the client's id, not the proxy's
        self.upstream_id = -1  # the proxy's id of the request on the broker's connection (set when it is sent)
        self._until = _UNDECIDED  # then _DECLINED, or the end (size prefix included) of what may go early
        self.sent = 0  # the answer's bytes handed to the transport (size prefix included)

    def advance(self, frame: bytearray, have: int) -> None:
        """``frame`` (an answer, size prefix included) has its first ``have`` bytes: those that may go early, and
        were not sent yet, handed to the client's transport (which copies what its socket does not take at once)."""
        if self._until == _UNDECIDED:
            view = memoryview(frame)
            try:
                end = fetch_records_end(view[SIZE.size:have], self._header)
            except (IndexError, struct.error):
                if have < len(frame):
                    return  # more is needed to tell
                end = None  # whole and still short: not a Fetch answer the walk will take
            finally:
                view.release()
            if (end is None or SIZE.size + end > len(frame)
                    or CORRELATION_ID.unpack_from(frame, SIZE.size)[0] != self.upstream_id  # out of turn: refused
                    or len(frame) - have < RELAY_MIN_BYTES):  # nothing would go before it is whole
                self._until = _DECLINED
                return
            self._until = SIZE.size + end
            CORRELATION_ID.pack_into(frame, SIZE.size, self.client_id)
        upto = min(have, self._until)
        if (upto - self.sent >= RELAY_MIN_BYTES or upto == self._until > self.sent) \
                and not self.transport.is_closing():  # the client left: nothing more to write
            self.transport.write(memoryview(frame)[self.sent:upto])
            self.sent = upto

    def abort(self, reason: str, broker: str) -> None:
        """The answer from ``broker`` (host:port) cannot be finished as it was begun, for ``reason``: when part of
        it went, the client's connection is reset (what is queued for it dropped, RST), counted and logged; a client
        that left first is counted ``closed``."""
        if not self.sent:
            return
        if self.transport.is_closing():
            _CLOSED.inc()
            return
        _ABORTED.inc()
        log.warning("proxy: a Fetch answer sent on to the client as it came cannot be finished: the client's "
                    "connection is reset (it fetches again on a new one)",
                    extra={"broker": broker, "reason": reason, "sent_bytes": self.sent})
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            except OSError:
                pass  # closed already
        self.transport.abort()

    def finished(self, frame: bytearray) -> Relayed | None:
        """The answer whole and found unchanged: what is left of it to send, or None when none of it went early."""
        if not self.sent:
            return None
        (_CLOSED if self.transport.is_closing() else _SENT).inc()
        return Relayed(frame, self.sent)


class Relayed:
    """A broker's answer whose first :attr:`sent` bytes went to the client as they came (:class:`Relay`): the
    listener writes the rest (:meth:`rest`). Its length is the whole answer's (counted as such)."""

    __slots__ = ("frame", "sent")

    def __init__(self, frame: bytearray, sent: int) -> None:
        self.frame = frame
        self.sent = sent

    def __len__(self) -> int:
        return len(self.frame)

    def rest(self) -> memoryview:
        return memoryview(self.frame)[self.sent:]

    def __repr__(self) -> str:
        return f"Relayed({len(self.frame)} bytes, {self.sent} sent early)"

