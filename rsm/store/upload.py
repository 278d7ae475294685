"""Streaming multipart uploads with bounded memory: the coordination layer of :meth:`rsm.store.s3.S3Store.put`
(as s3transfer's upload manager is boto3's), with the S3 requests passed in, so it runs against recording doubles.

What one put does:

- the chunks fill a part buffer of ``part_size_bytes``; an object that fits in one part is one whole-object PUT
  (``put_whole``), never a multipart upload;
- a larger one starts the multipart upload (``start``) on the pool when its first part is full, so the round trip
  overlaps the filling of the second part; every part is uploaded on the pool (``upload_part``, after ``start``'s
  answer), up to ``parts_in_flight`` at once, and the upload completed (``complete``) with the parts in order;
- memory: at most ``parts_in_flight + 1`` part buffers (the one filling, those uploading), reused from part to
  part: a full buffer goes to its upload as is (not copied) and comes back when the upload ends. The producer waits
  for a buffer: that is the bound, and the back-pressure on the reading of the local segment;
- the first error wins: a part that fails (after the store's retries) stops the producer at its next part, the
  parts not started are cancelled, those running are waited for, and the upload is aborted (``abort``), so nothing
  is visible: S3 makes an object visible only at ``PutObject`` / ``CompleteMultipartUpload``. The same on an error
  of the chunks themselves (an unreadable local file, a cancelled copy).

Parts in flight and the bandwidth-delay product: a part of ``P`` MiB costs about ``t0 + P * t1`` on S3 (60 ms +
20 ms/MiB measured), so one connection carries ``P / (t0 + P * t1)`` (about 38 MB/s at 8 MiB) and a put reaches a
rate ``R`` with ``R * (t0 + P * t1) / P`` parts in flight. ``S3Store`` takes ``parts_in_flight`` from its memory
budget (``upload_memory_bytes // part_size_bytes - 1``), capped by ``upload_concurrency``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future, wait

from rsm.store.base import Chunk, iter_buffers

__all__ = ["PART_SIZE_BYTES", "UPLOAD_CONCURRENCY", "UPLOAD_MEMORY_BYTES", "PartBuffers", "new_part_buffer",
           "put_in_parts"]

MiB = 1024 * 1024
UPLOAD_CONCURRENCY = 10
"""Parts uploading at once, all puts of a store together (the upload pool's threads): s3transfer's default."""
PART_SIZE_BYTES = 5 * MiB
"""S3's smallest part. Within a memory budget ``M`` a put reaches ``(M - P) / (t0 + P * t1)``: smaller parts go
faster, since each part's fixed cost ``t0`` is paid in parallel while its bytes wait in a buffer. With 48 MiB, 5 MiB
parts put 8 in flight (about 250 MB/s on S3's figures) where 8 MiB parts put 5 (about 180 MB/s); the price is 1.5x
the UploadPart requests (220 PUTs per GiB instead of 144: about $0.001 per GiB copied at $0.005 per 1,000)."""
UPLOAD_MEMORY_BYTES = 48 * MiB
"""Part buffers one put holds at most (the one filling and those uploading): 9 parts of 5 MiB, 8 in flight.
bench_s3, 256 MiB copies on the latency emulator, side by side (2026-11-26, load 2-4): 8 MiB parts, 5 in flight:
117 MB/s, 60 MiB RSS above idle; 8 MiB parts with 64 MiB (7 in flight): 121 MB/s, 71 MiB, past the design's 64 MiB
per copy; 5 MiB parts with 48 MiB (8 in flight): 122 MB/s, 50 MiB; boto3's ``upload_file``: 101 MB/s."""


def new_part_buffer(n: int) -> bytearray:
    """A part buffer of ``n`` bytes (a module function so a test can count the buffers a put allocates)."""
    return bytearray(n)


class PartBuffers:
    """At most ``count`` part buffers of ``size_bytes``, allocated on demand and reused. :meth:`take` waits while
    all are out, until one is given back (:meth:`give`) or :meth:`stop` is called (then it raises what stopped it)."""

    def __init__(self, size_bytes: int, count: int) -> None:
        if count < 2:
            raise ValueError(f"a put needs 2 part buffers at least (one filling, one uploading), got {count}")
        self.size_bytes = size_bytes
        self.count = count
        self._free: list[bytearray] = []
        self._allocated = 0
        self._cond = threading.Condition()
        self._error: BaseException | None = None

    def take(self) -> bytearray:
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                if self._free:
                    return self._free.pop()
                if self._allocated < self.count:
                    self._allocated += 1
                    return new_part_buffer(self.size_bytes)
                self._cond.wait()

    def give(self, buf: bytearray) -> None:
        with self._cond:
            if len(buf) == self.size_bytes:  # a last part was cut short: not reused
                self._free.append(buf)
            self._cond.notify()

    def stop(self, error: BaseException) -> None:
        """The first error: :meth:`take` raises it from now on (a waiting producer wakes)."""
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the buffers allocated so far: what the put holds, at most ``size_bytes * count``."""
        with self._cond:
            return self._allocated * self.size_bytes

    @property
    def error(self) -> BaseException | None:
        with self._cond:
            return self._error


def put_in_parts(chunks: Iterable[Chunk], *, part_size_bytes: int, parts_in_flight: int, pool: Executor,
                 put_whole: Callable[[bytearray], None], start: Callable[[], str],
                 upload_part: Callable[[str, int, bytearray], dict], complete: Callable[[str, list[dict], int], None],
                 abort: Callable[[str], None]) -> int:
    """Upload the object ``chunks`` make (see the module doc); its size in bytes.

    ``put_whole(body)`` puts an object of one part; ``start()`` begins a multipart upload and returns its id;
    ``upload_part(upload_id, number, body)`` returns the part's entry for ``complete(upload_id, parts, size)``
    (``{"PartNumber": n, "ETag": ...}``); ``abort(upload_id)`` aborts (and must not raise). Each raises on failure
    (after its own retries); the first error is raised here, after the upload was aborted."""
    buffers = PartBuffers(part_size_bytes, parts_in_flight + 1)
    started: Future[str] | None = None
    futures: list[Future[dict]] = []
    size = 0

    def upload(upload_id: Future[str], number: int, buf: bytearray) -> dict:
        return upload_part(upload_id.result(), number, buf)

    def failed(f: Future) -> None:
        if not f.cancelled() and (error := f.exception()) is not None:
            buffers.stop(error)

    def submit(buf: bytearray) -> None:
        nonlocal started
        if started is None:
            started = pool.submit(start)
            started.add_done_callback(failed)
        fut = pool.submit(upload, started, len(futures) + 1, buf)

        def done(f: Future[dict], buf: bytearray = buf) -> None:
            failed(f)
            buffers.give(buf)

        fut.add_done_callback(done)
        futures.append(fut)

    try:
        part = buffers.take()
        fill = 0
        for chunk in iter_buffers(chunks):
            mv = memoryview(chunk).cast("B")
            while mv:
                if fill == part_size_bytes:  # a full part goes once more bytes come: an object of one part is one PUT
                    size += fill
                    submit(part)
                    part = buffers.take()  # waits for a buffer; raises a part's error
                    fill = 0
                n = min(len(mv), part_size_bytes - fill)
                part[fill:fill + n] = mv[:n]
                fill += n
                mv = mv[n:]
        if started is None:
            del part[fill:]
            put_whole(part)
            return fill
        size += fill
        del part[fill:]
        submit(part)
        parts = [f.result() for f in futures]
        complete(started.result(), parts, size)
        return size
    except BaseException as err:
        buffers.stop(err)
        if started is not None:
            for f in futures:
                f.cancel()
            wait([started, *futures])
            if started.exception() is None:
                abort(started.result())
        first = buffers.error
        if first is not None and first is not err and not isinstance(err, KeyboardInterrupt | SystemExit):
            raise first from None  # a part's error, seen by the producer as its own
        raise
