"""Multipart uploads with parts in flight (rsm/store/upload.py, issue 25): against recording doubles, parts run
concurrently up to the bound, the part buffers a put allocates stay within ``parts_in_flight + 1`` and are reused,
the object is reassembled exactly in part order; the first error (a part's, or the chunks' own) stops the producer,
aborts the upload and is raised, with nothing completed. On moto: a part that fails leaves no object and no
unfinished upload, and a copy whose part fails leaves nothing under its keys."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import botocore.exceptions as bexc
import pytest

from rsm.api import RemoteSegmentMetadata
from rsm.errors import CopyCancelledError, RemoteStorageError
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store import upload
from rsm.store.s3 import S3Store
from tests.support.batches import synthetic_segment
from tests.support.stores import new_bucket, s3_client_for

KiB = 1024
MiB = 1024 * KiB
PART = 64 * KiB  # the doubles take any part size; S3's 5 MiB minimum is the store's business


class Recorder:
    """The S3 requests of one put, recorded: parts by number, how many ran at once, what was aborted."""

    def __init__(self, *, fail_part: int | None = None, barrier: threading.Barrier | None = None) -> None:
        self.parts: dict[int, bytes] = {}
        self.whole: bytes | None = None
        self.started = 0
        self.completed: tuple[str, list[dict], int] | None = None
        self.aborted: list[str] = []
        self.fail_part = fail_part
        self.barrier = barrier
        self._lock = threading.Lock()
        self._running = 0
        self.most_running = 0

    def put_whole(self, body: bytearray) -> None:
        self.whole = bytes(body)

    def start(self) -> str:
        self.started += 1
        return "upload-1"

    def upload_part(self, upload_id: str, number: int, body: bytearray) -> dict:
        assert upload_id == "upload-1"
        with self._lock:
            self._running += 1
            self.most_running = max(self.most_running, self._running)
        try:
            if self.barrier is not None and number <= self.barrier.parties:
                self.barrier.wait(timeout=30)  # the first parts all run at once, or this breaks
            if number == self.fail_part:
                raise RemoteStorageError(f"part {number} refused")
            data = bytes(body)
        finally:
            with self._lock:
                self._running -= 1
        with self._lock:
            self.parts[number] = data
        return {"PartNumber": number, "ETag": f"e{number}"}

    def complete(self, upload_id: str, parts: list[dict], size: int) -> None:
        self.completed = (upload_id, parts, size)

    def abort(self, upload_id: str) -> None:
        self.aborted.append(upload_id)

    def put(self, chunks, parts_in_flight: int, pool: ThreadPoolExecutor) -> int:
        return upload.put_in_parts(chunks, part_size_bytes=PART, parts_in_flight=parts_in_flight, pool=pool,
                                   put_whole=self.put_whole, start=self.start, upload_part=self.upload_part,
                                   complete=self.complete, abort=self.abort)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(8) as p:
        yield p


@pytest.fixture
def allocated(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the part buffers puts allocate."""
    sizes: list[int] = []
    real = upload.new_part_buffer

    def counting(n: int) -> bytearray:
        sizes.append(n)
        return real(n)

    monkeypatch.setattr(upload, "new_part_buffer", counting)
    return sizes


def _chunks(data: bytes, step: int, seen: list[int] | None = None) -> Iterator[bytes | list[bytes]]:
    for i, p in enumerate(range(0, len(data), step)):
        if seen is not None:
            seen.append(p)
        # every third chunk as a gather list (what the manager yields for a block plus its header)
        piece = data[p:p + step]
        yield [piece[:7], piece[7:]] if i % 3 == 0 else piece


def test_parts_in_flight_and_part_buffers_are_bounded(pool: ThreadPoolExecutor, allocated: list[int]) -> None:
    data = random.Random(1).randbytes(40 * PART + 1234)
    rec = Recorder(barrier=threading.Barrier(3))
    assert rec.put(_chunks(data, 10_000), 3, pool) == len(data)
    assert rec.most_running == 3  # the barrier: three parts at once; never more
    assert len(allocated) <= 4 and set(allocated) == {PART}  # 3 in flight + 1 filling, reused for 41 parts
    assert rec.started == 1 and rec.aborted == []
    assert rec.completed is not None
    upload_id, parts, size = rec.completed
    assert [p["PartNumber"] for p in parts] == list(range(1, 42)) and size == len(data)
    assert b"".join(rec.parts[n] for n in range(1, 42)) == data


def test_an_object_of_one_part_is_one_put(pool: ThreadPoolExecutor) -> None:
    for data in (b"", b"x" * 100, bytes(PART)):
        rec = Recorder()
        assert rec.put(_chunks(data, 333), 2, pool) == len(data)
        assert rec.whole == data and rec.started == 0 and rec.parts == {} and rec.completed is None


def test_a_failed_part_stops_the_producer_and_aborts(pool: ThreadPoolExecutor) -> None:
    data = random.Random(2).randbytes(200 * PART)
    seen: list[int] = []
    rec = Recorder(fail_part=3)
    with pytest.raises(RemoteStorageError, match="part 3 refused"):
        rec.put(_chunks(data, PART // 2, seen), 2, pool)
    assert rec.aborted == ["upload-1"] and rec.completed is None
    # the producer stopped at its next part buffer: a few parts read, never the 200
    assert len(seen) * (PART // 2) <= 10 * PART


def test_an_error_of_the_chunks_aborts_and_is_raised_as_is(pool: ThreadPoolExecutor) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(5):
            yield bytes(PART)
        raise CopyCancelledError("cancelled")

    rec = Recorder()
    with pytest.raises(CopyCancelledError):
        rec.put(chunks(), 3, pool)
    assert rec.aborted == ["upload-1"] and rec.completed is None


class _NoClient:
    """Stands in for a boto3 client where none is called (S3Store registers its event hooks on it)."""

    class meta:  # noqa: N801 - boto3's name
        class events:  # noqa: N801
            @staticmethod
            def register(*_args: object, **_kwargs: object) -> None:
                return None


def test_parts_in_flight_follow_the_memory_budget() -> None:
    store = S3Store("b", part_size_bytes=8 * MiB, upload_memory_bytes=40 * MiB, upload_concurrency=10,
                    client=_NoClient())
    assert store.parts_in_flight == 4  # 5 buffers of 8 MiB: 1 filling, 4 uploading
    assert S3Store("b", part_size_bytes=8 * MiB, upload_memory_bytes=400 * MiB, upload_concurrency=6,
                   client=_NoClient()).parts_in_flight == 6
    with pytest.raises(RemoteStorageError, match="fewer than 2 parts"):
        S3Store("b", part_size_bytes=8 * MiB, upload_memory_bytes=15 * MiB, client=_NoClient())
    with pytest.raises(ValueError, match="2 parts of part_size_bytes"):
        RsmConfig(store="s3", bucket="b", part_size_bytes=8 * MiB, upload_memory_bytes=12 * MiB)


def test_the_default_copy_puts_8_parts_in_flight_within_48_mib() -> None:
    """The defaults (issue 25): S3's smallest parts, as many in flight as 48 MiB of part buffers holds, leaving
    room within the design's 64 MiB per copy for the blocks and the clients' own buffers."""
    config = RsmConfig(store="s3", bucket="b")
    store = S3Store("b", part_size_bytes=config.part_size_bytes, upload_memory_bytes=config.upload_memory_bytes,
                    client=_NoClient())
    assert (config.part_size_bytes, store.parts_in_flight) == (5 * MiB, 8)
    assert (store.parts_in_flight + 1) * store.part_size_bytes <= 48 * MiB
    assert S3Store("b", client=_NoClient()).parts_in_flight == 8


def _fail_part(store: S3Store, number: int) -> None:
    """Make UploadPart ``number`` of ``store``'s client fail for good (a 400: not retried)."""
    real = store.client.upload_part

    def upload_part(**kwargs):
        if kwargs["PartNumber"] == number:
            raise bexc.ClientError({"Error": {"Code": "InvalidPart", "Message": "injected"},
                                    "ResponseMetadata": {"HTTPStatusCode": 400}}, "UploadPart")
        return real(**kwargs)

    store.client.upload_part = upload_part  # type: ignore[method-assign]


@pytest.mark.s3
def test_a_failed_part_leaves_no_object_and_no_upload_on_moto(s3_endpoint: str) -> None:
    client = s3_client_for(s3_endpoint)
    bucket = new_bucket(client)
    store = S3Store(bucket, endpoint_url=s3_endpoint, region_name="us-east-1", part_size_bytes=5 * MiB,
                    upload_memory_bytes=20 * MiB)
    try:
        _fail_part(store, 2)
        data = random.Random(3).randbytes(12 * MiB)
        with pytest.raises(RemoteStorageError, match="InvalidPart"):
            store.put("f/obj", (data[p:p + MiB] for p in range(0, len(data), MiB)))
        assert store.head("f/obj") is None
        assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    finally:
        store.close()


@pytest.mark.s3
def test_a_copy_whose_part_fails_leaves_nothing(s3_endpoint: str, tmp_path: Path) -> None:
    client = s3_client_for(s3_endpoint)
    bucket = new_bucket(client)
    store = S3Store(bucket, endpoint_url=s3_endpoint, region_name="us-east-1", part_size_bytes=5 * MiB)
    rsm = RemoteStorageManager(RsmConfig(store="s3", bucket=bucket, part_size_bytes=5 * MiB), store)
    data, last = synthetic_segment(tmp_path, 6 * MiB)  # two parts
    try:
        _fail_part(store, 2)
        md = RemoteSegmentMetadata(uuid.uuid4(), uuid.uuid4(), "up", 0, 0, last)
        with pytest.raises(RemoteStorageError, match="InvalidPart"):
            rsm.copy_log_segment_data(md, data)
        assert list(store.list(rsm.keys(md).prefix)) == []
        assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
        store.client.upload_part = type(store.client).upload_part.__get__(store.client)  # type: ignore[method-assign]
        md = RemoteSegmentMetadata(uuid.uuid4(), uuid.uuid4(), "up", 0, 0, last)
        rsm.copy_log_segment_data(md, data)  # the same copy, the endpoint healthy: whole
        with rsm.fetch_log_segment(md, 0) as f:
            assert f.read() == data.log_path.read_bytes()
    finally:
        store.close()
