"""What clients that send part of a request and stop can make the listener hold: ``queued_max_request_bytes`` and the
stream's read-ahead (:mod:`rlm.listener.net.request_room`), over real sockets against the real server (no broker:
the server over the stub tier of :mod:`tests.support.stub_listener`; frames are never decoded before they are
whole, so no topic is needed). Memory is the process's RSS from ``/proc/self/status``; the clients send from one
shared buffer.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import struct
import time
from typing import Any

from prometheus_client import REGISTRY

from rlm.config import HistorySaslSettings
from rlm.listener.net.request_room import RequestRoom
from rlm.listener.net.server import ConnectionLimits, ListenerServer
from tests.rlm.listener.raw_wire import call, closed, recv_frame, request
from tests.support.sidecar import wait_for
from tests.support.stub_listener import serving

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
MiB = 1 << 20


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def closed_for(reason: str) -> float:
    return REGISTRY.get_sample_value("rlm_history_closed_connections_total", {"reason": reason}) or 0


def on_loop(srv: ListenerServer, fn: Any) -> Any:
    """``fn()`` run on the server's event loop (its counters are the loop's)."""
    loop = srv._loop
    assert loop is not None
    return asyncio.run_coroutine_threadsafe(_call(fn), loop).result(5)


async def _call(fn: Any) -> Any:
    return fn()


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closed ``sock`` (within ``seconds``; one still open stays silent that long)."""
    sock.settimeout(seconds)
    try:
        return closed(sock)
    except TimeoutError:
        return False
    finally:
        sock.settimeout(20)


def large_frame_head(size: int) -> bytes:
    """The size and header of an ApiVersions v0 request frame of ``size`` bytes: the rest is padding the client
    sends after it (a frame that does not decode is answered INVALID_REQUEST, once whole)."""
    return struct.pack(">ihhih", size, API_VERSIONS, 0, 7, 1) + b"t"


def push(socks: list[socket.socket], data: memoryview, sent: list[int], seconds: float) -> None:
    """Send ``data`` on every socket (non-blocking) until all is sent or nothing more is taken for a second."""
    end, idle_since = time.monotonic() + seconds, time.monotonic()
    while time.monotonic() < end and time.monotonic() - idle_since < 1.0:
        for i, s in enumerate(socks):
            if sent[i] < len(data):
                try:
                    n = s.send(data[sent[i]:sent[i] + MiB])
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    sent[i] = len(data)  # closed by the server
                    continue
                if n:
                    sent[i] += n
                    idle_since = time.monotonic()
        time.sleep(0.01)


def test_partial_large_requests_are_held_within_queued_max_request_bytes() -> None:
    """24 connections (no SASL: as authenticated) each send 8 MiB of a 20 MiB request and stop, against a
    ``queued_max_request_bytes`` of 16 MiB. The server holds one frame (a frame fits when nothing else is held) and
    the others wait without being read: RSS grows by less than 48 MiB (without the bound: each connection's 8 MiB,
    192 MiB; with the bound but a 1 MiB stream limit, 2.25 MiB more of read-ahead per waiting connection, 52 MiB).
    Each finished in turn, the frames are answered, each waiting connection served once the one before is done."""
    size, part, n = 20 * MiB, 8 * MiB, 24
    head = large_frame_head(size)
    data = memoryview(head + b"\0" * (size + 4 - len(head)))  # the whole frame, size prefix included
    with serving(ConnectionLimits(queued_max_request_bytes=16 * MiB)) as srv:
        gc.collect()
        before = rss_mib()
        socks = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(n)]
        try:
            for s in socks:
                s.setblocking(False)
            sent = [0] * n
            push(socks, data[:part], sent, 30)
            time.sleep(0.5)
            grown = rss_mib() - before
            held = on_loop(srv, lambda: srv.requests.held)
            assert held == size, f"{held} request bytes held: one frame"
            assert REGISTRY.get_sample_value("rlm_history_queued_request_bytes") == size
            assert grown < 48, f"RSS grew {grown:.0f} MiB with {n} unfinished 20 MiB requests (16 MiB bound)"
            # finish them one after the other: each is answered (INVALID_REQUEST: padding), none is refused
            for i, s in enumerate(socks):
                s.setblocking(True)
                s.settimeout(30)
                s.sendall(data[sent[i]:])
                frame = recv_frame(s)
                assert frame is not None and struct.unpack_from(">i", frame)[0] == 7, f"connection {i} answered"
            assert on_loop(srv, lambda: srv.requests.held) == 0
        finally:
            for s in socks:
                s.close()


def test_strangers_have_a_room_of_their_own_and_make_nobody_who_authenticated_wait() -> None:
    """With SASL and an 8 MiB room (strangers' own: 1 MiB beside it), 16 unauthenticated connections from two
    addresses each send the size of a 512 KiB frame (the largest allowed before authentication) and nothing more: one
    of each address takes its half of the strangers' room,
    the other 14 are closed at once (``request_memory``), none left waiting. A client that authenticates meanwhile
    (its frames are small) then sends a 1 MiB request: answered at once. With one room for both (h3's finding, session
    18), the 16 sizes alone filled it and the authenticated request waited for the strangers' deadline (60 s here)."""
    password = "pw-" + "x" * 8
    sasl = HistorySaslSettings(mechanisms=["PLAIN"], users={"alice": password})
    size = 512 * 1024
    limits = ConnectionLimits(queued_max_request_bytes=8 * MiB, authentication_timeout_s=60)
    with serving(limits, sasl) as srv:
        before = closed_for("request_memory")
        socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=20,
                                          source_address=(f"127.0.0.{2 + i % 2}", 0)) for i in range(16)]
        try:
            for s in socks:
                s.sendall(struct.pack(">i", size))
            wait_for(lambda: closed_for("request_memory") - before >= 14, 10, "14 connections refused")
            assert sum(closed_within(s, 1.0) for s in socks) == 14
            assert on_loop(srv, lambda: (srv.pre_auth_requests.held, srv.requests.held)) == (2 * size, 0)
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as ok:
                assert call(ok, SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == 0
                token = b"\0alice\0" + password.encode()
                ok.sendall(request(SASL_AUTHENTICATE, 1, struct.pack(">i", len(token)) + token, correlation_id=9))
                frame = recv_frame(ok)
                assert frame is not None and struct.unpack_from(">ih", frame) == (9, 0), "authenticated"
                head = large_frame_head(MiB)
                ok.sendall(head + b"\0" * (MiB + 4 - len(head)))
                frame = recv_frame(ok)  # (the socket's timeout is 10 s: the strangers' deadline is 60 s)
                assert frame is not None and struct.unpack_from(">i", frame)[0] == 7, "the 1 MiB request answered"
            assert closed_for("request_memory") - before == 14
        finally:
            for s in socks:
                s.close()
        wait_for(lambda: on_loop(srv, lambda: srv.pre_auth_requests.held + srv.requests.held) == 0, 10,
                 "the rooms given back")


def test_a_waiter_cancelled_takes_nothing_and_the_next_is_served_in_order() -> None:
    """RequestRoom: waiters are served first come, first served; one cancelled while it waits (its connection's
    deadline) takes nothing, and one cancelled just as room was given to it hands it on."""

    async def scenario() -> list[str]:
        room, order = RequestRoom(10), []  # each frame from an address of its own (the share per address: 5)
        assert room.try_take(8, ("x",))

        async def want(name: str, n: int) -> None:
            await room.take(n, (name,))
            order.append(name)

        a = asyncio.ensure_future(want("a", 5))
        b = asyncio.ensure_future(want("b", 2))  # would fit now, but waits behind a
        await asyncio.sleep(0)
        assert not room.try_take(1, ("z",)) and order == []
        a.cancel()
        await asyncio.wait([a, b])
        assert order == ["b"] and room.held == 10
        c = asyncio.ensure_future(want("c", 9))
        await asyncio.sleep(0)
        room.give(8, ("x",))
        room.give(2, ("b",))  # c is given the room (held 9) and cancelled before it runs: the room goes back
        c.cancel()
        await asyncio.wait([c])
        assert room.held == 0, room.held
        return order

    assert asyncio.run(scenario()) == ["b"]


def test_a_frame_waiting_for_its_address_share_holds_up_nobody() -> None:
    """RequestRoom with a bound of 10 (5 per address): address a holds 4 and waits to take 4 more (past its share);
    b's 5 are taken at once, not queued behind a's frame; a's waiting frame is served once a's first is given back."""

    async def scenario() -> None:
        room = RequestRoom(10)
        assert room.try_take(4, ("a",))
        second = asyncio.ensure_future(room.take(4, ("a",)))
        await asyncio.sleep(0)
        assert not second.done()
        assert room.try_take(5, ("b",)), "b is not held up by a frame waiting for a's share"
        assert (room.held, room.held_by("a"), room.held_by("b")) == (9, 4, 5)
        room.give(4, ("a",))
        await asyncio.wait_for(second, 1)
        assert (room.held, room.held_by("a")) == (9, 4)
        room.give(4, ("a",))
        room.give(5, ("b",))
        assert room.held == 0 and room.held_by("a") == 0

    asyncio.run(scenario())


def test_one_address_holding_frame_sizes_makes_another_wait_for_nothing() -> None:
    """A 16 MiB room (8 MiB per address): one client (127.0.0.2, no SASL: as authenticated) opens three connections
    and sends on each the size of an 8 MiB frame and nothing more; another (127.0.0.3) then sends a whole 1 MiB
    request: answered at once. The first holds one frame's 8 MiB (its other two wait for its share). Without the share
    its first two frames held all 16 MiB, its third queued, and the 1 MiB request waited behind them until their idle
    limit (ten minutes by default; the socket's 10 s timeout here)."""
    size = 8 * MiB
    with serving(ConnectionLimits(queued_max_request_bytes=16 * MiB)) as srv:
        hogs = [socket.create_connection(("127.0.0.1", srv.port), timeout=20, source_address=("127.0.0.2", 0))
                for _ in range(3)]
        try:
            for s in hogs:
                s.sendall(large_frame_head(size))
            wait_for(lambda: on_loop(srv, lambda: srv.requests.held_by("127.0.0.2")) == size, 10, "a frame held")
            time.sleep(0.2)  # the other two have asked for room by now
            assert on_loop(srv, lambda: srv.requests.held) == size
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10, source_address=("127.0.0.3", 0)) as ok:
                head = large_frame_head(MiB)
                ok.sendall(head + b"\0" * (MiB + 4 - len(head)))
                frame = recv_frame(ok)
                assert frame is not None and struct.unpack_from(">i", frame)[0] == 7, "the 1 MiB request answered"
        finally:
            for s in hogs:
                s.close()
        wait_for(lambda: on_loop(srv, lambda: srv.requests.held) == 0, 10, "the room given back")


def test_room_given_back_between_a_waiter_cancelled_and_its_task_resumed() -> None:
    """A waiting connection's task is cancelled (its deadline) and, before the task runs again, another request's
    room is given back: the cancelled waiter is passed over (before: ``set_result`` on its cancelled future raised
    InvalidStateError out of ``give``, in the connection that gave the room back, and the waiter's own clean-up then
    failed to find its entry), takes nothing, and the room is whole again."""

    async def scenario() -> None:
        room = RequestRoom(10)
        assert room.try_take(8, ("x",))
        waiting = asyncio.ensure_future(room.take(5, ("a",)))
        await asyncio.sleep(0)
        waiting.cancel()  # its future is cancelled now; the task resumes at the next loop round
        room.give(8, ("x",))
        try:
            await waiting
        except asyncio.CancelledError:
            pass
        assert waiting.cancelled()
        assert room.held == 0 and room.try_take(10, ("b",))

    asyncio.run(scenario())


def authenticated(addr: str, port: int, name: str, password: str) -> socket.socket:
    """A connection from ``addr`` logged in as ``name`` (SASL PLAIN)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(addr, 0))
    assert call(s, SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == 0
    token = b"\0" + name.encode() + b"\0" + password.encode()
    s.sendall(request(SASL_AUTHENTICATE, 1, struct.pack(">i", len(token)) + token, correlation_id=9))
    frame = recv_frame(s)
    assert frame is not None and struct.unpack_from(">ih", frame) == (9, 0), f"{name} authenticated from {addr}"
    return s


def test_one_principal_from_many_addresses_holds_half_the_room() -> None:
    """With SASL and a 16 MiB room (8 MiB per address and per principal): alice logs in from three addresses
    (127.0.0.2-4) and sends on each connection the size of an 8 MiB frame and nothing more; she holds one frame's
    8 MiB (the others wait for her share). bob (127.0.0.5) then sends a whole 1 MiB request: answered at once.
    With a share per address only, two of alice's addresses held all 16 MiB and bob waited until their idle limit
    (the socket's 10 s timeout here)."""
    users = {"alice": "pw-alice-" + "x" * 8, "bob": "pw-bob-" + "y" * 8}
    sasl = HistorySaslSettings(mechanisms=["PLAIN"], users=users)
    size = 8 * MiB
    with serving(ConnectionLimits(queued_max_request_bytes=16 * MiB), sasl) as srv:
        hogs = [authenticated(f"127.0.0.{2 + i}", srv.port, "alice", users["alice"]) for i in range(3)]
        try:
            for s in hogs:
                s.sendall(large_frame_head(size))
            wait_for(lambda: on_loop(srv, lambda: srv.requests.held) >= size, 10, "a frame held")
            time.sleep(0.2)  # the other two have asked for room by now
            with authenticated("127.0.0.5", srv.port, "bob", users["bob"]) as ok:
                head = large_frame_head(MiB)
                ok.sendall(head + b"\0" * (MiB + 4 - len(head)))
                frame = recv_frame(ok)
                assert frame is not None and struct.unpack_from(">i", frame)[0] == 7, "bob's 1 MiB request answered"
            assert on_loop(srv, lambda: (srv.requests.held, srv.requests.held_by("User:alice"))) == (size, size)
        finally:
            for s in hogs:
                s.close()
        wait_for(lambda: on_loop(srv, lambda: srv.requests.held) == 0, 10, "the room given back")
