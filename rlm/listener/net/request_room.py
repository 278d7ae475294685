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

One address holds at most half a room (:data:`ADDRESS_SHARE`; a frame of any allowed size when the address holds
nothing), and a frame waiting for its address's share holds up nobody: the others wait in their order of arrival for
the room as a whole. Without the share, a frame's 4-byte size being enough to take its room, one client (one that
authenticated, or any client of a listener without SASL) held the whole room with three connections each sending the
size of a 100 MiB frame and nothing more, and every other request over 64 KiB (a proxied Produce) waited behind them
for their idle limit (``connections_max_idle_ms``, 10 minutes).

The share is kept per *owner*, and a frame has one owner per identity of its client: its address, and once it has
authenticated, its principal too (not ``User:ANONYMOUS``, which every client of a listener without authentication
shares); it must fit every one of its owners' shares. Without the principal's, one user connecting from three
addresses held the whole room as one address could before the share (test_one_principal_from_many_addresses...).

Used on the event loop only: no lock.
"""

from __future__ import annotations

import asyncio
import collections

__all__ = ["ADDRESS_SHARE", "Owners", "RequestRoom"]

ADDRESS_SHARE = 2
"""One owner (an address, a principal) holds at most ``bound // ADDRESS_SHARE`` of a room (or one frame, when it
holds nothing)."""

Owners = tuple[str, ...]
"""The owners a frame is held for: its client's address, and its principal once authenticated."""


class RequestRoom:
    """Bytes of request frames held at once, within ``bound`` and ``bound // ADDRESS_SHARE`` per owner (a frame's
    ``owners``: its client's address and principal); the frames waiting for room as a whole are served in their
    order of arrival, a frame waiting for one of its owners' shares holds up nobody."""

    __slots__ = ("bound", "held", "owner_bound", "_by_owner", "_waiters")

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.owner_bound = bound // ADDRESS_SHARE
        self.held = 0
        self._by_owner: dict[str, int] = {}
        self._waiters: collections.deque[tuple[int, Owners, asyncio.Future[None]]] = collections.deque()

    def _owners_fit(self, nbytes: int, owners: Owners) -> bool:
        by_owner, bound = self._by_owner, self.owner_bound
        for owner in owners:
            mine = by_owner.get(owner, 0)
            if mine and mine + nbytes > bound:
                return False
        return True

    def _fits(self, nbytes: int) -> bool:
        return self.held == 0 or self.held + nbytes <= self.bound

    def held_by(self, owner: str) -> int:
        """Bytes ``owner`` holds now."""
        return self._by_owner.get(owner, 0)

    def try_take(self, nbytes: int, owners: Owners) -> bool:
        """Take ``nbytes`` for ``owners`` now if they fit, and no frame that waits for the room as a whole came first;
        False otherwise (nothing taken)."""
        if not (self._fits(nbytes) and self._owners_fit(nbytes, owners)):
            return False
        if any(self._owners_fit(n, o) for n, o, _ in self._waiters):
            return False
        self._take(nbytes, owners)
        return True

    def _take(self, nbytes: int, owners: Owners) -> None:
        self.held += nbytes
        by_owner = self._by_owner
        for owner in owners:
            by_owner[owner] = by_owner.get(owner, 0) + nbytes

    async def take(self, nbytes: int, owners: Owners) -> None:
        """Take ``nbytes`` for ``owners``, waiting for room behind the frames that waited first for the room as a
        whole (and for each owner's share). Cancelled (the connection's deadline), it takes nothing."""
        if self.try_take(nbytes, owners):
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (nbytes, owners, waiter)
        self._waiters.append(entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give(nbytes, owners)  # room was taken for it as it was cancelled: hand it on
            else:
                if entry in self._waiters:  # (a _wake between its cancellation and now dropped it already)
                    self._waiters.remove(entry)
                self._wake()
            raise

    def give(self, nbytes: int, owners: Owners) -> None:
        """Give back what a request of ``owners`` held (answered, or its connection gone)."""
        self.held -= nbytes
        by_owner = self._by_owner
        for owner in owners:
            mine = by_owner[owner] - nbytes
            if mine:
                by_owner[owner] = mine
            else:
                del by_owner[owner]
        self._wake()

    def _wake(self) -> None:
        """Serve the waiters in order: one waiting for an owner's share is passed over; the first that waits for
        the room as a whole and does not fit stops the round (those behind it wait their turn)."""
        for entry in list(self._waiters):
            nbytes, owners, waiter = entry
            if waiter.done():  # cancelled (its connection's deadline), its task not resumed yet: it takes nothing
                self._waiters.remove(entry)
                continue
            if not self._owners_fit(nbytes, owners):
                continue
            if not self._fits(nbytes):
                break
            self._waiters.remove(entry)
            self._take(nbytes, owners)
            waiter.set_result(None)
