"""Large requests against the listener's event loop (issue 22, r8), no broker: the server over a stub catalog.

kio's native reader decodes a whole frame in one call holding the GIL (so the event loop) throughout: about 50 ms
for a 4.8 MB Fetch, a second for a 100 MiB one. A large request is decoded an array item at a time instead, and what
it and its answer made is freed a slice at a time. What the event loop's lag then is, is measured by
``bench/bench_listener_stall.py``; here, behaviour only.
"""

from __future__ import annotations

import io
import socket
import struct
import sys
import threading
import typing
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

import rlm.listener.protocol.codec as codec
from rlm.listener.net.server import INLINE_FRAME_BYTES, ListenerServer
from rlm.listener.protocol.apis import API_KEYS, PROXY_API_KEYS, SASL_API_KEYS
from rlm.listener.protocol.codec import ErrorCode, build, decode_request, free_gradually
from rlm.listener.protocol.frame import BadRequestError, read_header
from tests.rlm.listener.raw_wire import call, recv_frame, request
from tests.support.sidecar import wait_for
from tests.support.stub_listener import SERVED, serving


def sample(entity_type: type, depth: int = 0) -> dict[str, Any]:
    """Values for every field of ``entity_type``: arrays of three items (structs nested inside), strings, ints, the
    tagged fields included (so they are sent)."""
    values: dict[str, Any] = {}
    for f in fields(entity_type):
        tp, _nullable = codec._inner(f.type)
        kafka_type = f.metadata.get("kafka_type") or ""
        if typing.get_origin(tp) is tuple:
            item = typing.get_args(tp)[0]
            if is_dataclass(item):
                values[f.name] = [sample(typing.cast(type, item), depth + 1) for _ in range(3)]
            elif kafka_type.startswith("int"):
                values[f.name] = [1, 2]
            elif kafka_type == "string":
                values[f.name] = ["x", "y"]
        elif is_dataclass(tp):
            values[f.name] = sample(typing.cast(type, tp), depth + 1)
        elif kafka_type == "string":
            values[f.name] = f"s{depth}"
        elif kafka_type.startswith("int"):
            values[f.name] = 7
    return values


def frame_of(api_key: int, version: int, values: dict[str, Any]) -> bytes:
    """A request frame (no size prefix; header v1: non-flexible versions, or v2 with an empty tag section)."""
    schema = load_request_schema(api_key, version)
    out = io.BytesIO()
    entity_writer(schema)(out, build(schema, values))
    tags = b"\0" if schema.__flexible__ else b""
    return struct.pack(">hhih", api_key, version, 1, 1) + b"t" + tags + out.getvalue()


def test_item_at_a_time_decoding_is_kios() -> None:
    """Every request the listener decodes, at every version kio knows: decoded an item at a time, the entity equals
    kio's own decoding, every array item is in ``keep``; a truncated frame is a BadRequestError both ways."""
    checked = 0
    for api_key in sorted({**API_KEYS, **SASL_API_KEYS, **PROXY_API_KEYS}):
        for version in range(0, 20):
            try:
                schema = load_request_schema(api_key, version)
            except Exception:  # noqa: BLE001 - kio: no such version
                continue
            frame = frame_of(api_key, version, sample(schema))
            header = read_header(frame)
            keep: list[Any] = []
            whole = decode_request(frame, header)
            assert decode_request(frame, header, keep=keep) == whole, (api_key, version)
            assert len(keep) == len(list(_items(whole))), (api_key, version)
            for cut in (1, 7):
                with pytest.raises(BadRequestError):
                    decode_request(frame[:-cut], header)
                with pytest.raises(BadRequestError):
                    decode_request(frame[:-cut], header, keep=[])
            checked += 1
    assert checked > 50


def _items(entity: Any) -> Iterator[Any]:
    for f in fields(entity):
        value = getattr(entity, f.name)
        if isinstance(value, tuple):
            for item in value:
                if is_dataclass(item):
                    yield item
                    yield from _items(item)


def test_answers_are_built_with_their_items_listed_and_freed_in_slices() -> None:
    """``build(..., keep)`` lists every struct of the answer's arrays, so that dropping the answer only lowers their
    counts; :func:`free_gradually` empties handlers' values (dicts of lists) and ``keep``, a slice at a time."""
    rtype = load_response_schema(1, 4)
    values = {"responses": [{"topic": "t", "partitions": [{"partition_index": i, "records": b""}
                                                          for i in range(3000)]}]}
    keep: list[Any] = []
    entity = build(rtype, values, keep)
    assert len(keep) == 3001 and keep[-1] is entity.responses[0] and keep[0] is entity.responses[0].partitions[0]
    slices: list[int] = []

    class Counted(list):  # type: ignore[type-arg]
        def __delitem__(self, index: Any) -> None:
            slices.append(len(self[index]))
            super().__delitem__(index)

    listed = Counted(keep)
    free_gradually(listed, step=1000)
    assert listed == [] and slices == [1000, 1000, 1000, 1]
    partitions = values["responses"][0]["partitions"]
    free_gradually(values, step=1000)
    assert values == {} and partitions == []  # emptied by slices, not freed whole with the topic's dict


# ------------------------------------------------------------------------------------------------ the server
@pytest.fixture
def server() -> Iterator[ListenerServer]:
    with serving() as srv:
        yield srv


def test_other_connections_are_answered_while_a_large_request_is_being_decoded(
        server: ListenerServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Fetch of 20,000 partitions (320 KB): its decoding is held in the middle, at partition 10,000 (as kio's
    native reader would hold the event loop for a whole frame of millions); meanwhile another connection's
    ApiVersions and Metadata are answered. Released, the large Fetch is answered, each partition in order."""
    n, middle, big_id = 20_000, 10_000, 4242
    partition_type = load_request_schema(1, 4).__dataclass_fields__["topics"].type.__args__[0]
    partition_type = partition_type.__dataclass_fields__["partitions"].type.__args__[0]
    reached, release = threading.Event(), threading.Event()
    native = codec.entity_reader
    seen = {"items": 0}
    switch = {"before": sys.getswitchinterval()}

    def entity_reader_(entity_type: Any, *args: Any) -> Any:
        read = native(entity_type, *args)
        if entity_type is not partition_type:
            return read

        def held(frame: Any, offset: int) -> Any:
            seen["items"] += 1
            if seen["items"] == middle:
                switch["during"] = sys.getswitchinterval()
                reached.set()
                assert release.wait(60)
            return read(frame, offset)

        return held

    monkeypatch.setattr(codec, "entity_reader", entity_reader_)
    big = request(1, 4, frame_of(1, 4, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 2**20, "topics": [
            {"topic": "not-served", "partitions": [{"partition": i, "fetch_offset": 0, "partition_max_bytes": 1}
                                                   for i in range(n)]}]})[struct.calcsize(">hhih") + 1:],
                  correlation_id=big_id)
    assert len(big) > INLINE_FRAME_BYTES
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as large, \
            socket.create_connection(("127.0.0.1", server.port), timeout=10) as other:
        large.sendall(big)
        assert reached.wait(30), "the large Fetch was not decoded an item at a time"
        versions = call(other, 18, 0, {})  # a held event loop leaves it unanswered: socket.timeout fails the test
        assert versions is not None and versions.error_code == 0
        meta = call(other, 3, 1, {"topics": None})
        assert meta is not None and [t.name for t in meta.topics] == [SERVED.name]
        assert seen["items"] == middle  # still decoding
        release.set()
        frame = recv_frame(large)
        assert frame is not None and struct.unpack_from(">i", frame)[0] == big_id
        resp, _size = entity_reader(load_response_schema(1, 4))(frame, 4)
        parts = resp.responses[0].partitions
        assert [p.partition_index for p in parts] == list(range(n))
        assert {p.error_code for p in parts} == {ErrorCode.unknown_topic_or_partition}
    # The interpreter switched threads every 1 ms while the large request was worked on, as before once answered.
    assert switch["during"] == 0.001 and sys.getswitchinterval() == switch["before"] > 0.001


def test_the_switch_interval_is_lowered_while_large_requests_are_worked_on() -> None:
    """GcPause lowers the interpreter's switch interval while any large request is held, restores it when the last
    one is answered, and leaves an interval already as low alone."""
    from rlm.listener.net.server import GcPause

    default = sys.getswitchinterval()
    pause = GcPause(switch_interval_s=0.001)
    with pause.held():
        with pause.held():
            assert sys.getswitchinterval() == 0.001
        assert sys.getswitchinterval() == 0.001  # the first holder still works
    assert sys.getswitchinterval() == default
    sys.setswitchinterval(0.0005)
    try:
        with pause.held():
            assert sys.getswitchinterval() == 0.0005
        assert sys.getswitchinterval() == 0.0005
    finally:
        sys.setswitchinterval(default)


def test_a_fetch_answered_at_once_takes_one_worker_job(server: ListenerServer,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A Fetch whose answer is final on its first run (here: a topic not served) is read and encoded in one worker
    job: each hop between the event loop and the pool costs the loop a wake-up and callbacks, per request."""
    jobs: list[str] = []
    submit = server._pool.submit

    def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        jobs.append(getattr(fn, "__qualname__", repr(fn)))
        return submit(fn, *args, **kwargs)

    monkeypatch.setattr(server._pool, "submit", counted)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        resp = call(s, 1, 4, {"replica_id": -1, "max_wait": 500, "min_bytes": 1, "max_bytes": 2**20, "topics": [
            {"topic": "not-served", "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1}]}]})
    assert resp is not None
    assert resp.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_or_partition
    assert len(jobs) == 1, jobs


def test_answer_sized_buffers_are_not_faulted_in_at_each_answer(server: ListenerServer) -> None:
    """Once the listener started, a worker thread making and freeing answer-sized buffers (three of 1 MiB, as a
    1 MiB Fetch answer's records, encoding and frame) keeps its memory: glibc's dynamic thresholds gave it back to
    the kernel at each free, so every answer page-faulted its buffers in again (counted in minor faults: 150 times
    as many)."""
    import resource

    faults: dict[str, int] = {}

    def answers() -> None:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(200):
            buffers = [bytearray(1 << 20) for _ in range(3)]
            del buffers
        faults["minor"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    worker = threading.Thread(target=answers)
    worker.start()
    worker.join()
    assert faults["minor"] < 200 * 256 // 10  # a 1 MiB buffer is 256 pages: far fewer than one buffer per answer


def test_every_schema_offered_is_imported_when_the_server_starts() -> None:
    """kio imports a schema's module at its first use: at a version's first request, that import ran on the event
    loop and held it 5-20 ms. A fresh interpreter that starts the server has the request and response schema modules
    of every version it offers imported before any request is made."""
    import subprocess

    code = """
import sys
from kio.index import _get_entity_path, _name_from_key
from kio.index import EntityType
from rlm.listener.net.server import ListenerServer
from rlm.listener.routing import Router
from rlm.listener.tier.context import TierContext
from rlm.listener.tier.node import NodeAnswers, NodeInfo

ctx = TierContext(None, None, None)
router = Router(ctx, NodeAnswers(ctx, NodeInfo(1, "127.0.0.1", 0, "c")))
wanted = {_get_entity_path(_name_from_key(key), v, kind).split(":")[0]
          for key, (lo, hi) in router.offered.items() for v in range(lo, hi + 1)
          for kind in (EntityType.request, EntityType.response)}
before = wanted - set(sys.modules)
srv = ListenerServer(router, "127.0.0.1", 0).start()
after = wanted - set(sys.modules)
srv.stop()
print(len(wanted), len(before), len(after))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    wanted, before, after = map(int, out.stdout.split()[-3:])
    assert wanted > 100 and before > 100  # not imported by importing the server's modules
    assert after == 0


def test_a_large_requests_answer_is_counted_as_queued_while_the_request_is_freed(
        server: ListenerServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large request's items are freed (on a worker, a slice at a time) after its answer is made and before the
    answer is written: meanwhile the answer counts in :meth:`ListenerServer.queued_response_bytes` (the bound on
    answers queued to clients), as it does from its first write on; then nothing is counted any more."""
    import rlm.listener.net.server as srv_module

    n = 20_000
    request_item = load_request_schema(1, 4).__dataclass_fields__["topics"].type.__args__[0]
    request_item = request_item.__dataclass_fields__["partitions"].type.__args__[0]
    reached, release = threading.Event(), threading.Event()
    counted: list[int] = []
    free = srv_module.free_gradually

    def held_free(obj: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(obj, list) and obj and isinstance(obj[0], request_item):  # the request's items
            counted.append(server.queued_response_bytes())  # read on a worker: an int, a snapshot
            reached.set()
            assert release.wait(60)
        free(obj, *args, **kwargs)

    monkeypatch.setattr(srv_module, "free_gradually", held_free)
    big = request(1, 4, frame_of(1, 4, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 2**20, "topics": [
            {"topic": "not-served", "partitions": [{"partition": i, "fetch_offset": 0, "partition_max_bytes": 1}
                                                   for i in range(n)]}]})[struct.calcsize(">hhih") + 1:])
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as large:
        large.sendall(big)
        assert reached.wait(30), "the large request's items were not freed"
        release.set()
        frame = recv_frame(large)
    assert frame is not None
    assert counted == [len(frame) + 4]  # the whole answer, its size prefix included
    wait_for(lambda: server.queued_response_bytes() == 0, 10, "nothing to be counted as queued once it was taken")
