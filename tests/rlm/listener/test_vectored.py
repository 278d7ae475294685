"""Vectored writes (rlm.listener.net.vectored): byte-exact against a slow reader, whatever the socket takes at once,
and no part referenced once the call returns (the parts are overwritten right after it)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from rlm.listener.net.vectored import (
    IOV_MAX,
    QUEUE_AT_MOST_BYTES,
    SENDFILE_MIN_BYTES,
    _in_file,
    send_parts,
    vectored,
    write_parts,
)
from rsm.store.fs import FileSystemStore

SMALL_BUFFER = 4096  # the kernel rounds it up (and doubles it): still far below what is written


def _slow_reader(sock: socket.socket, nbytes: int, out: bytearray, done: threading.Event) -> None:
    """Read ``nbytes`` in small reads, pausing now and then: the writer's socket fills and takes parts in pieces."""
    sock.settimeout(10)
    reads = 0
    try:
        while len(out) < nbytes:
            chunk = sock.recv(1024)
            if not chunk:
                break
            out += chunk
            reads += 1
            if reads % 64 == 0:
                time.sleep(0.001)
    except TimeoutError:
        pass  # bytes missing: the test compares what came
    finally:
        done.set()


def _parts(rng_seed: int) -> list[bytearray | memoryview | bytes]:
    """Parts of many sizes and kinds: small fields, records larger than the socket's buffers, views into a
    larger buffer, empty ones, and more of them than one writev takes (IOV_MAX)."""
    rnd = __import__("random").Random(rng_seed)
    parts: list[bytearray | memoryview | bytes] = []
    for i in range(IOV_MAX + 300):
        kind = i % 5
        if kind == 0:
            parts.append(bytearray(os.urandom(rnd.randint(1, 40))))
        elif kind == 1:
            parts.append(bytearray(os.urandom(rnd.randint(100, 300))))
        elif kind == 2:
            big = bytearray(os.urandom(rnd.randint(300, 800)))
            parts.append(memoryview(big)[rnd.randint(0, 50):])
        elif kind == 3:
            parts.append(b"")
        else:
            parts.append(bytearray(os.urandom(rnd.randint(1, 20))))
    parts[5] = bytearray(os.urandom(256 * 1024))  # larger than both kernel buffers
    parts[-3] = bytearray(os.urandom(200 * 1024))
    return parts


async def _serve_one(parts_rounds: list[list[bytearray | memoryview | bytes]]) -> tuple[bytes, list[int], bool]:
    """A real TCP connection with small buffers on both ends; each round's parts written with write_parts (the
    second round while the transport may still hold bytes of the first), every part overwritten at once after the
    call; what the slow reader got, what the socket took at once per round, and whether the transport was
    vectored."""
    loop = asyncio.get_running_loop()
    connected: asyncio.Future[asyncio.StreamWriter] = loop.create_future()

    async def on_client(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected.set_result(writer)

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)  # before connect: the window stays small
    client.connect(("127.0.0.1", port))
    writer = await connected
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
    total = sum(len(p) for parts in parts_rounds for p in parts)
    got = bytearray()
    done = threading.Event()
    reader = threading.Thread(target=_slow_reader, args=(client, total, got, done), daemon=True)
    reader.start()
    taken = []
    try:
        for parts in parts_rounds:
            taken.append(write_parts(writer.transport, parts))
            for p in parts:  # the contract: no part is referenced after the call
                if isinstance(p, bytearray):
                    p[:] = b"\xee" * len(p)
                elif isinstance(p, memoryview) and not p.readonly:
                    p[:] = b"\xee" * len(p)
        await writer.drain()
        while not done.is_set():
            await asyncio.sleep(0.01)
        return bytes(got), taken, vectored(writer.transport)
    finally:
        writer.close()
        client.close()
        server.close()
        await server.wait_closed()


def test_parts_arrive_byte_exact_through_a_slow_reader() -> None:
    first, second = _parts(1), _parts(2)
    expected = b"".join(bytes(p) for p in first) + b"".join(bytes(p) for p in second)
    got, taken, was_vectored = asyncio.run(_serve_one([first, second]))
    assert was_vectored
    assert got == expected
    # the socket took part of the first round at once (the rest queued, copied, in the transport), and nothing of
    # the second: the transport still held bytes, so they queued behind them
    assert 0 < taken[0] < sum(map(len, first))
    assert taken[1] == 0


def test_all_taken_at_once_leaves_the_transport_empty() -> None:
    async def run() -> tuple[int, int, bytes]:
        loop = asyncio.get_running_loop()
        connected: asyncio.Future[asyncio.StreamWriter] = loop.create_future()
        server = await asyncio.start_server(lambda _r, w: connected.set_result(w), "127.0.0.1", 0)
        client = socket.create_connection(server.sockets[0].getsockname()[:2])
        writer = await connected
        parts = [b"head", bytearray(b"x" * 1000), memoryview(b"0123456789")[2:], b"tail"]
        n = write_parts(writer.transport, parts)
        left = writer.transport.get_write_buffer_size()
        client.settimeout(10)
        got = b""
        while len(got) < n:
            got += client.recv(65536)
        writer.close()
        client.close()
        server.close()
        await server.wait_closed()
        return n, left, got

    n, left, got = asyncio.run(run())
    assert n == 4 + 1000 + 8 + 4
    assert left == 0
    assert got == b"head" + b"x" * 1000 + b"23456789" + b"tail"


def test_parts_mapped_from_a_file_are_sent_from_it_byte_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tier's blocks on the filesystem store are views of the file mapped (rsm.store.fs.MappedFile): a long one
    is sent from the file (sendfile: no copy into the socket), a short one goes in the writev, the rest of one the
    socket did not take is queued as the rest of any part; the bytes are the file's, in order, through a slow reader,
    even with the file deleted before the write (its mapping keeps it open)."""
    store = FileSystemStore(tmp_path, fsync=False)
    data = os.urandom(3 * 1024 * 1024)
    store.put("blocks", [data])
    ranges = [(100, 300 * 1024), (400 * 1024 + 7, 1000), (500 * 1024 + 3, SENDFILE_MIN_BYTES),
              (2 * 1024 * 1024 + 11, 700 * 1024)]
    views = [store.map_range("blocks", start, n) for start, n in ranges]
    store.delete("blocks")
    sent: list[int] = []
    real = os.sendfile

    def sendfile(out: int, src: int, position: int, count: int) -> int:
        n = real(out, src, position, count)
        sent.append(n)
        return n

    monkeypatch.setattr(os, "sendfile", sendfile)
    first: list[bytearray | memoryview | bytes] = [b"head", views[0], b"mid", views[1], views[2], b"tail"]
    second: list[bytearray | memoryview | bytes] = [bytearray(b"x" * 100), views[3], b"end"]
    expected = b"".join(bytes(p) for p in first + second)
    assert expected[4:4 + 300 * 1024] == data[100:100 + 300 * 1024]
    got, taken, was_vectored = asyncio.run(_serve_one([first, second]))
    assert was_vectored
    assert got == expected
    assert sent and 0 < sent[0] <= 300 * 1024  # the first long part went from the file: the socket took what it could
    assert 0 < taken[0] < sum(map(len, first)) and taken[1] == 0


def test_a_short_or_unmapped_part_is_not_sent_from_a_file(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path, fsync=False)
    store.put("blocks", [os.urandom(SENDFILE_MIN_BYTES + 10)])
    whole = store.map_range("blocks", 5, SENDFILE_MIN_BYTES)
    fd, position, length = whole.obj.file_range(whole)  # type: ignore[union-attr]
    assert (position, length) == (5, SENDFILE_MIN_BYTES) and fd >= 0
    assert _in_file(whole) == (fd, 5, SENDFILE_MIN_BYTES)
    assert _in_file(whole[1:]) is None  # shorter than SENDFILE_MIN_BYTES: in the writev
    assert _in_file(memoryview(bytearray(2 * SENDFILE_MIN_BYTES))) is None
    assert _in_file(bytes(2 * SENDFILE_MIN_BYTES)) is None


async def _send_in_rounds(parts: list[bytearray | memoryview | bytes]) -> tuple[bytes, list[int], list[int]]:
    """``parts`` written with send_parts in rounds, each drained before the next, to a slow reader over a real TCP
    connection with small buffers; after each round every part before the position reached is overwritten (the
    contract: none of them is referenced). What the reader got, the transport's buffer after each round, and the
    bytes the socket took at once in each."""
    loop = asyncio.get_running_loop()
    connected: asyncio.Future[asyncio.StreamWriter] = loop.create_future()
    server = await asyncio.start_server(lambda _r, w: connected.set_result(w), "127.0.0.1", 0)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)
    client.connect(server.sockets[0].getsockname()[:2])
    writer = await connected
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
    writer.transport.set_write_buffer_limits(high=0)  # as the listener's: drain() waits until the socket took all
    total = sum(map(len, parts))
    got = bytearray()
    done = threading.Event()
    threading.Thread(target=_slow_reader, args=(client, total, got, done), daemon=True).start()
    held, taken = [], []
    at = (0, 0)
    try:
        while at[0] < len(parts):
            at, n = send_parts(writer.transport, parts, at)
            held.append(writer.transport.get_write_buffer_size())
            taken.append(n)
            for p in parts[:at[0]]:
                if isinstance(p, bytearray | memoryview) and not (isinstance(p, memoryview) and p.readonly):
                    p[:] = b"\xee" * len(p)
            await writer.drain()
        await writer.drain()
        while not done.is_set():
            await asyncio.sleep(0.01)
        return bytes(got), held, taken
    finally:
        writer.close()
        client.close()
        server.close()
        await server.wait_closed()


def test_send_parts_in_rounds_is_byte_exact_and_copies_little(tmp_path: Path) -> None:
    """An answer far larger than the socket's buffers, written with send_parts and drained between rounds (as the
    listener writes answers above WRITE_SLICE_BYTES over plaintext): the reader gets every byte in order (parts of
    every kind, a mapped file's long parts sent from it, rounds stopping inside parts), and the transport never holds
    more than QUEUE_AT_MOST_BYTES of it: the rest went to the socket from the parts' own buffers. Parts before the
    position reached are overwritten after each round and the bytes still arrive as they were."""
    store = FileSystemStore(tmp_path, fsync=False)
    data = os.urandom(2 * 1024 * 1024)
    store.put("blocks", [data])
    parts = _parts(3)
    parts[40] = store.map_range("blocks", 11, 700 * 1024)
    parts[90] = store.map_range("blocks", 900 * 1024, SENDFILE_MIN_BYTES + 1)
    parts.insert(0, bytearray(os.urandom(QUEUE_AT_MOST_BYTES * 3 + 5)))  # a round stops inside it, then queues
    expected = b"".join(bytes(p) for p in parts)
    got, held, taken = asyncio.run(_send_in_rounds(parts))
    assert got == expected
    assert len(held) > 3 and max(held) <= QUEUE_AT_MOST_BYTES
    assert len(expected) - sum(taken) <= len(held) * QUEUE_AT_MOST_BYTES  # copied: QUEUE_AT_MOST_BYTES a round


def test_send_parts_writes_nothing_while_the_transport_holds_bytes() -> None:
    async def run() -> tuple[tuple[int, int], int]:
        loop = asyncio.get_running_loop()
        connected: asyncio.Future[asyncio.StreamWriter] = loop.create_future()
        server = await asyncio.start_server(lambda _r, w: connected.set_result(w), "127.0.0.1", 0)
        client = socket.create_connection(server.sockets[0].getsockname()[:2])
        writer = await connected
        writer.transport.pause_reading()
        writer.transport._buffer.extend(b"queued")  # type: ignore[attr-defined]  # as if the socket had not taken it
        at, n = send_parts(writer.transport, [b"head", b"tail"], (0, 0))
        writer.transport._buffer.clear()  # type: ignore[attr-defined]
        writer.close()
        client.close()
        server.close()
        await server.wait_closed()
        return at, n

    at, n = asyncio.run(run())
    assert at == (0, 0) and n == 0
