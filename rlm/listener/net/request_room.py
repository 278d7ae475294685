"""The request bytes a listener holds at once: ``history_listener.queued_max_request_bytes`` (Kafka's
``queued.max.request.bytes``, whose memory pool mutes the sockets of new requests once it is spent).

A connection reads ahead of the request it serves at most what its stream's buffer takes before it stops reading
(:data:`rlm.listener.net.server.READER_LIMIT_BYTES`: twice it, plus one receive of the transport). A request frame
larger than that is held in memory whole (a small one in the stream's buffer, a large one in its own mapping) from
the moment its body is read until its answer is made, so it takes its size from this room first:

- a connection that has authenticated (or a listener without SASL) waits for room, reading nothing more meanwhile
  (its client's bytes stay in the kernel's socket buffers, as a broker's muted channel's do); the connection's idle
  limit still applies to the wait;
- one that has not authenticated yet takes from a room of its own instead (an eighth of the bound, beside it:
  :data:`rlm.listener.net.server.PRE_AUTH_ROOM_SHARE`), and is closed at once when that has none: strangers neither
  wait nor make anyone who authenticated wait. (One room for both, strangers filled it with frame sizes alone, no
  body sent, and an authenticated request waited for their authentication deadline, up to 30 s.)

A frame is let in when nothing else is held, whatever its size (``socket_request_max_bytes`` bounds it), so a room
smaller than the largest request still serves it, one at a time. Held bytes are given back when the request is
answered or its connection ends. Without this bound, a client could hold ``socket_request_max_bytes`` (100 MiB) per
connection by sending part of a large frame and stopping, 200 connections per address (measured before: 200
unauthenticated connections, each 512 KiB of an unfinished SASL frame, +150 MiB RSS).

Used on the event loop only: no lock.
"""

from __future__ import annotations

import asyncio
import collections

__all__ = ["RequestRoom"]


class RequestRoom:
    """Bytes of request frames held at once, within ``bound``; the waiters are served in their order of arrival."""

    __slots__ = ("bound", "held", "_waiters")

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.held = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def _fits(self, nbytes: int) -> bool:
        return self.held == 0 or self.held + nbytes <= self.bound

    def try_take(self, nbytes: int) -> bool:
        """Take ``nbytes`` now if they fit and nobody waits before; False otherwise (nothing taken)."""
        if self._waiters or not self._fits(nbytes):
            return False
        self.held += nbytes
        return True

    async def take(self, nbytes: int) -> None:
        """Take ``nbytes``, waiting for room behind the connections that waited first. Cancelled (the connection's
        deadline), it takes nothing."""
        if self.try_take(nbytes):
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (nbytes, waiter)
        self._waiters.append(entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give(nbytes)  # room was taken for it as it was cancelled: hand it on
            else:
                self._waiters.remove(entry)
                self._wake()
            raise

    def give(self, nbytes: int) -> None:
        """Give back what a request held (answered, or its connection gone)."""
        self.held -= nbytes
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            nbytes, waiter = self._waiters.popleft()
            self.held += nbytes
            waiter.set_result(None)
