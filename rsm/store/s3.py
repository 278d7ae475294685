"""An S3 object store on boto3 (AWS or any S3-compatible endpoint).

- Puts stream (:mod:`rsm.store.upload`): chunks fill a part buffer of ``part_size_bytes``; an object that fits in
  one part is one ``PutObject``, a larger one a multipart upload with ``parts_in_flight`` parts uploading at once
  (aborted on failure, so nothing partial is ever visible: S3 makes an object visible only at
  ``PutObject``/``CompleteMultipartUpload``). Memory: ``upload_memory_bytes`` of part buffers per put at most
  (``parts_in_flight + 1`` buffers, reused; a full part is handed to its upload as is, not copied).
- Gets are ranged ``GetObject`` streams; a stream that breaks mid-body is resumed with a new ranged GET from
  the byte where it stopped. A sequential read of several blocks gets ``read_ahead_bytes`` of ranged GETs in
  flight (:mod:`rsm.format.readahead`; one connection carries only about 88 MB/s on S3).
- Hedged GETs (:mod:`rsm.store.hedge`): a GET not answered by the p95 of recent GETs is sent again, the first
  answer used, within ``hedge_share`` (5%) of GETs: S3's slow outliers (0.4-2 s) cost about the p95 plus one more
  first byte.
- Retries: botocore's ``standard`` retry mode (throttling, 5xx, connection errors) plus our own, with
  exponential backoff and jitter, around each request and each resumed stream.
- For S3-compatible endpoints: ``endpoint_url`` and ``request_checksum_calculation="when_required"`` (newer
  botocore otherwise sends CRC trailers some endpoints reject; in that mode DeleteObjects carries ``Content-MD5``,
  not ``x-amz-checksum-crc32``, which s3proxy refuses), path-style addressing on request. Tested against moto and
  s3proxy (a real S3 server over a directory).
- ``requests`` counts the HTTP requests actually sent (retries included), per operation.
- A SIGKILLed writer leaves an incomplete multipart upload (invisible, but billed):
  :meth:`S3Store.abort_stale_uploads` (run by garbage collection after its grace) aborts those.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, TypeVar

import boto3
import botocore.exceptions as bexc
from botocore.config import Config

from rsm.errors import RemoteResourceNotFoundError, RemoteStorageError, StoreConfigError
from rsm.store.base import Chunk, ObjectInfo, RequestCounter
from rsm.store.hedge import HEDGE_SHARE, Hedger
from rsm.store.upload import PART_SIZE_BYTES, UPLOAD_CONCURRENCY, UPLOAD_MEMORY_BYTES, put_in_parts

__all__ = ["S3Store"]

log = logging.getLogger(__name__)

MiB = 1024 * 1024
_T = TypeVar("_T")

READ_AHEAD_BYTES = 80 * MiB
"""A sequential read's read-ahead budget by default: ten 8 MiB ranged GETs in flight, as boto3's transfer manager
keeps (``max_concurrency`` 10). bench_s3 on emulated S3 latency, 256 MiB: 32 MiB read at 0.61x boto3's
``download_fileobj``, 64 MiB (eight GETs) at 0.69-1.08x from run to run, under 0.8x in most runs on a loaded
machine (one connection carries about 88 MB/s: eight connections against boto3's ten are 0.8x at best once the
store's bandwidth per connection is what limits both)."""
BODY_READ_BYTES = 1024 * 1024
"""The most one read of a GET's body asks botocore for (a read-ahead GET fills an 8 MiB buffer in reads of this
size). One read of the whole range made urllib3 allocate the whole range as a new ``bytes`` (fresh pages, page-faulted
in, then copied into the caller's buffer): 1 MiB reads reuse the allocator's memory; measured on s3proxy, 128 MiB in
8 MiB GETs: 0.88-1.18 ms of CPU per MiB and 23-173 minor faults per MiB, against 1.07-1.77 ms and 120-393 faults."""
MAX_POOL_CONNECTIONS = 64
"""Connections the client keeps: what the process's read-ahead budget keeps in flight
(:data:`rsm.format.readahead.PROCESS_BUDGET_BYTES`: 32 GETs of 8 MiB), the parts of puts in flight, and hedges. With
fewer (botocore's default is 10), the GETs past the pool's size each open a connection and close it after one request
(urllib3: "connection pool is full, discarding connection"): on S3 a TLS handshake per GET."""

# Errors worth another attempt: the connection or the stream broke, or the server said "try again".
_TRANSIENT = (bexc.EndpointConnectionError, bexc.ConnectionClosedError, bexc.ReadTimeoutError,
              bexc.ConnectTimeoutError, bexc.ResponseStreamingError, bexc.IncompleteReadError,
              bexc.ProxyConnectionError, ConnectionError)


def _status(err: bexc.ClientError) -> int:
    return int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _code(err: bexc.ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def _transient(err: BaseException) -> bool:
    if isinstance(err, _TRANSIENT):
        return True
    if isinstance(err, bexc.ClientError):
        if _status(err) == 501 or _code(err) == "NotImplemented":
            return False  # the endpoint lacks the feature: asking again cannot help
        return _status(err) >= 500 or _code(err) in ("SlowDown", "RequestTimeout", "InternalError")
    return False


def _content_md5_instead_of_crc(params: dict, **_: object) -> None:
    """DeleteObjects must carry a body checksum: send ``Content-MD5`` (what S3 has always taken) rather than
    newer botocore's ``x-amz-checksum-crc32``, which some S3-compatible servers refuse (s3proxy 2.6 answers
    501 NotImplemented to the unknown header). A ``before-call`` hook: the checksum context is resolved then,
    the header not yet computed."""
    checksum = params.get("context", {}).get("checksum", {})
    checksum.pop("request_algorithm", None)
    checksum.pop("request_algorithm_header", None)
    body = params.get("body") or b""
    if isinstance(body, str):
        body = body.encode()
    params.setdefault("headers", {})["Content-MD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()


def _close_body(answer: dict) -> None:
    """Close the body of a ``GetObject`` answer left unread (a hedged GET's loser)."""
    answer["Body"].close()


class _ResumableBody(io.RawIOBase):
    """A ranged GET body that re-issues the GET from where it broke (up to ``attempts`` times)."""

    def __init__(self, store: S3Store, key: str, start: int, end_inclusive: int | None, body, length: int) -> None:
        self._store, self._key, self._pos, self._end = store, key, start, end_inclusive
        self._body = body
        self._remaining = length

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        if self._remaining <= 0:
            return 0
        mv = memoryview(b)
        want = min(len(mv), self._remaining, BODY_READ_BYTES)
        failures = 0
        while True:
            try:
                data = self._body.read(want)
                if not data:
                    raise bexc.IncompleteReadError(actual_bytes=0, expected_bytes=self._remaining)
                break
            except _TRANSIENT as err:
                failures += 1
                if failures > self._store.retries:
                    raise RemoteStorageError(
                        f"get s3://{self._store.bucket}/{self._key} broke at byte {self._pos} "
                        f"{failures} times: {err}") from err
                log.debug("resuming GET %s at byte %d after %s", self._key, self._pos, err)
                self._store._sleep_backoff(failures)
                self._close_body()
                self._body, _ = self._store._open(self._key, self._pos, self._end)
        n = len(data)
        mv[:n] = data
        self._pos += n
        self._remaining -= n
        return n

    def _close_body(self) -> None:
        try:
            self._body.close()
        except Exception:  # noqa: BLE001 - closing a broken stream may fail any way; nothing to do
            pass

    def close(self) -> None:
        if not self.closed:
            self._close_body()
        super().close()


class S3Store:
    """Objects in one S3 bucket, optionally under a key prefix."""

    def __init__(self, bucket: str, *, endpoint_url: str | None = None, region_name: str | None = None,
                 key_prefix: str = "", part_size_bytes: int = PART_SIZE_BYTES,
                 upload_concurrency: int = UPLOAD_CONCURRENCY,
                 upload_memory_bytes: int = UPLOAD_MEMORY_BYTES, retries: int = 5, connect_timeout_s: float = 10.0,
                 read_timeout_s: float = 60.0, max_pool_connections: int = MAX_POOL_CONNECTIONS,
                 path_style: bool = True, checksum_when_required: bool = True, create_bucket: bool = False,
                 read_ahead_bytes: int = READ_AHEAD_BYTES,
                 hedge_share: float = HEDGE_SHARE, client=None) -> None:
        if part_size_bytes < 5 * MiB:
            raise StoreConfigError(f"part_size_bytes {part_size_bytes} is below S3's 5 MiB minimum part size")
        if upload_memory_bytes < 2 * part_size_bytes:
            raise StoreConfigError(f"upload_memory_bytes {upload_memory_bytes} holds fewer than 2 parts of "
                                   f"{part_size_bytes} bytes (one filling, one uploading)")
        self.bucket = bucket
        self.key_prefix = key_prefix
        self.part_size_bytes = part_size_bytes
        self.upload_concurrency = max(1, upload_concurrency)
        self.upload_memory_bytes = upload_memory_bytes
        self.parts_in_flight = min(self.upload_concurrency, upload_memory_bytes // part_size_bytes - 1)
        """Parts of one put uploading at once: its part buffers (``upload_memory_bytes``) but the one filling, at
        most ``upload_concurrency`` (the upload pool's threads, which every put of the store shares)."""
        self._executor: ThreadPoolExecutor | None = None
        self._root: S3Store | None = None  # the store a with_key_prefix view was made from
        self._pool_lock = threading.Lock()
        self.retries = retries
        self.read_ahead_bytes = read_ahead_bytes
        """What a sequential read of several blocks keeps in flight by default (ReadAheadStore; see
        :data:`READ_AHEAD_BYTES`)."""
        self.requests = RequestCounter("s3")
        self.hedger: Hedger[dict] = Hedger(hedge_share, _close_body, store="s3")
        """GETs hedged after the p95 of recent ones' answer times, within ``hedge_share`` of GETs (rsm.store.hedge);
        shared by the views of this store."""
        if client is None:
            extra = {}
            if checksum_when_required:
                extra = {"request_checksum_calculation": "when_required",
                         "response_checksum_validation": "when_required"}
            config = Config(retries={"max_attempts": retries, "mode": "standard"},
                            connect_timeout=connect_timeout_s, read_timeout=read_timeout_s,
                            max_pool_connections=max_pool_connections,
                            s3={"addressing_style": "path" if path_style else "auto"}, **extra)
            client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, region_name=region_name,
                                                    config=config)
        self.client = client
        self.client.meta.events.register("before-send.s3.*", self._count)
        self.client.meta.events.register("after-call.s3.*", self._count_answer)
        self.client.meta.events.register("after-call-error.s3.*", self._count_failure)
        if checksum_when_required:
            self.client.meta.events.register("before-call.s3.DeleteObjects", _content_md5_instead_of_crc)
        if create_bucket:
            try:
                self.client.create_bucket(Bucket=bucket)
            except bexc.ClientError as err:
                if _code(err) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise StoreConfigError(f"cannot create bucket {bucket}: {err}") from err

    def __repr__(self) -> str:
        return f"S3Store({self.bucket!r}, prefix={self.key_prefix!r})"

    def with_key_prefix(self, key_prefix: str) -> S3Store:
        """The same bucket under another key prefix, sharing this store's client, upload pool and request
        counts (a copy recorded under an earlier ``key_prefix``)."""
        view = copy.copy(self)
        view.key_prefix = key_prefix
        view._root = self._root if self._root is not None else self
        return view

    def _count(self, event_name: str = "", **_: object) -> None:
        self.requests.add(event_name.rsplit(".", 1)[-1])

    def _count_answer(self, event_name: str = "", http_response: object = None, **_: object) -> None:
        """An S3 call answered (after botocore's retries): an error status other than 404 is counted."""
        status = getattr(http_response, "status_code", 200)
        if status >= 400 and status != 404:
            self.requests.error(event_name.rsplit(".", 1)[-1], str(status))

    def _count_failure(self, event_name: str = "", **_: object) -> None:
        """An S3 call that got no answer (connection refused, reset, timed out) after botocore's retries."""
        self.requests.error(event_name.rsplit(".", 1)[-1], "connection")

    def _k(self, key: str) -> str:
        return self.key_prefix + key

    def _sleep_backoff(self, attempt: int) -> None:
        time.sleep(min(2.0, 0.05 * (2 ** (attempt - 1))) * (0.5 + random.random()))

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        """Run one request with our retries on top of botocore's; wrap the final error."""
        attempt = 0
        while True:
            try:
                return fn()
            except (bexc.BotoCoreError, bexc.ClientError, ConnectionError) as err:
                attempt += 1
                if isinstance(err, bexc.ClientError) and _code(err) in ("NoSuchKey", "404", "NotFound"):
                    raise
                if not _transient(err) or attempt > self.retries:
                    raise RemoteStorageError(f"{what} failed after {attempt} attempt(s): {err}") from err
                log.debug("%s: retry %d after %s", what, attempt, err)
                self._sleep_backoff(attempt)

    # -- writes ------------------------------------------------------------------------------------------------

    def put(self, key: str, chunks: Iterable[Chunk]) -> int:
        """See :class:`~rsm.store.base.Store`; the multipart upload's coordination is :mod:`rsm.store.upload`."""
        k = self._k(key)
        where = f"put s3://{self.bucket}/{k}"
        try:
            return put_in_parts(
                chunks, part_size_bytes=self.part_size_bytes, parts_in_flight=self.parts_in_flight, pool=self._pool(),
                put_whole=lambda body: self._call(where, lambda: self.client.put_object(
                    Bucket=self.bucket, Key=k, Body=body)),
                start=lambda: self._call(where, lambda: self.client.create_multipart_upload(
                    Bucket=self.bucket, Key=k))["UploadId"],
                upload_part=lambda upload_id, number, body: self._upload_part(where, k, upload_id, number, body),
                complete=lambda upload_id, parts, size: self._complete(where, k, upload_id, parts, size),
                abort=lambda upload_id: self._abort(k, upload_id))
        except (bexc.BotoCoreError, bexc.ClientError) as err:
            raise RemoteStorageError(f"{where} failed: {err}") from err

    def close(self) -> None:
        """Shut the upload pool down (views share their root's: closing a view closes the root's). Idempotent; a
        later upload starts a new pool."""
        if self._root is not None:
            self._root.close()
            return
        with self._pool_lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _pool(self) -> ThreadPoolExecutor:
        if self._root is not None:
            return self._root._pool()
        with self._pool_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.upload_concurrency, thread_name_prefix="s3-upload")
            return self._executor

    def _upload_part(self, where: str, k: str, upload_id: str, number: int, body: bytearray) -> dict:
        r = self._call(f"{where} part {number}", lambda: self.client.upload_part(
            Bucket=self.bucket, Key=k, UploadId=upload_id, PartNumber=number, Body=body))
        return {"PartNumber": number, "ETag": r["ETag"]}

    def _complete(self, where: str, k: str, upload_id: str, parts: list[dict], size: int) -> None:
        attempt = 0
        while True:
            try:
                self.client.complete_multipart_upload(Bucket=self.bucket, Key=k, UploadId=upload_id,
                                                      MultipartUpload={"Parts": parts})
                return
            except (bexc.BotoCoreError, bexc.ClientError) as err:
                attempt += 1
                if isinstance(err, bexc.ClientError) and _code(err) == "NoSuchUpload" and attempt > 1:
                    # An earlier attempt completed it but its answer was lost: check the object is there.
                    if self.head(k[len(self.key_prefix):]) == size:
                        return
                if not _transient(err) or attempt > self.retries:
                    raise RemoteStorageError(f"{where}: completing the multipart upload failed: {err}") from err
                self._sleep_backoff(attempt)

    def _abort(self, k: str, upload_id: str) -> None:
        try:
            self._call(f"abort upload of {k}", lambda: self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=k, UploadId=upload_id))
        except RemoteStorageError as err:
            # The upload stays invisible to readers; the bucket's lifecycle rule for incomplete uploads ends it.
            log.warning("could not abort the multipart upload of %s: %s", k, err)

    def abort_stale_uploads(self, prefix: str, cutoff_ms: int) -> list[str]:
        """Abort the incomplete multipart uploads of keys under ``prefix`` whose last activity (initiation, or
        their newest part) is before ``cutoff_ms`` (epoch ms): what a killed writer left. Returns the keys
        (within this store's key prefix) whose uploads were aborted.

        An upload whose ``Initiated`` is not before the cutoff is judged by its parts: parts never predate their
        upload, so parts all older than the cutoff prove that ``Initiated`` is not the upload's (s3proxy answers
        the time of the listing there) and the upload is aborted. Such an upload without any part is left alone
        (its age is unknown): the bucket's lifecycle rule for incomplete uploads ends it."""
        out: list[str] = []
        n = len(self.key_prefix)
        kwargs: dict = {"Bucket": self.bucket, "Prefix": self._k(prefix)}
        where = f"list multipart uploads s3://{self.bucket}/{self._k(prefix)}"
        while True:
            r = self._call(where, lambda kw=dict(kwargs): self.client.list_multipart_uploads(**kw))
            for u in r.get("Uploads", []):
                key, upload_id = u["Key"], u["UploadId"]
                initiated = u["Initiated"].timestamp() * 1000
                try:
                    newest_part = self._newest_part_ms(key, upload_id)
                except RemoteStorageError as err:
                    if isinstance(err.__cause__, bexc.ClientError) and _code(err.__cause__) == "NoSuchUpload":
                        continue  # completed or aborted meanwhile
                    raise
                if initiated < cutoff_ms:
                    last = max(initiated, newest_part)
                elif newest_part:
                    last = newest_part  # Initiated is later than the parts: not the upload's own time
                else:
                    continue
                if last >= cutoff_ms:
                    continue
                self._call(f"abort upload of {key}", lambda k=key, i=upload_id: self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=k, UploadId=i))
                out.append(key[n:])
            if not r.get("IsTruncated"):
                return out
            kwargs["KeyMarker"] = r.get("NextKeyMarker")
            kwargs["UploadIdMarker"] = r.get("NextUploadIdMarker")

    def _newest_part_ms(self, key: str, upload_id: str) -> float:
        newest = 0.0
        kwargs: dict = {"Bucket": self.bucket, "Key": key, "UploadId": upload_id}
        while True:
            r = self._call(f"list parts of {key}", lambda kw=dict(kwargs): self.client.list_parts(**kw))
            for part in r.get("Parts", []):
                newest = max(newest, part["LastModified"].timestamp() * 1000)
            if not r.get("IsTruncated"):
                return newest
            kwargs["PartNumberMarker"] = r["NextPartNumberMarker"]

    # -- reads -------------------------------------------------------------------------------------------------

    def _open(self, key: str, start: int, end_inclusive: int | None):
        k = self._k(key)
        kwargs = {}
        if start > 0 or end_inclusive is not None:
            kwargs["Range"] = f"bytes={start}-{'' if end_inclusive is None else end_inclusive}"
        try:
            r = self._call(f"get s3://{self.bucket}/{k}", lambda: self.hedger.call(
                lambda: self.client.get_object(Bucket=self.bucket, Key=k, **kwargs)))
        except bexc.ClientError as err:
            raise RemoteResourceNotFoundError(f"no object s3://{self.bucket}/{k}") from err
        except RemoteStorageError as err:
            cause = err.__cause__
            if isinstance(cause, bexc.ClientError) and _code(cause) == "InvalidRange":
                return io.BytesIO(b""), 0
            raise
        return r["Body"], int(r["ContentLength"])

    def get(self, key: str, start: int = 0, end_inclusive: int | None = None) -> BinaryIO:
        if end_inclusive is not None and end_inclusive < start:
            return io.BytesIO(b"")
        body, length = self._open(key, start, end_inclusive)
        raw = _ResumableBody(self, key, start, end_inclusive, body, length)
        return io.BufferedReader(raw, 1 << 20)  # type: ignore[return-value]

    def get_bytes(self, key: str, start: int = 0, end_inclusive: int | None = None) -> bytes:
        with self.get(key, start, end_inclusive) as r:
            return r.read()

    def head(self, key: str) -> int | None:
        k = self._k(key)
        try:
            r = self._call(f"head s3://{self.bucket}/{k}",
                           lambda: self.client.head_object(Bucket=self.bucket, Key=k))
        except bexc.ClientError as err:
            if _status(err) == 404 or _code(err) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise RemoteStorageError(f"head s3://{self.bucket}/{k} failed: {err}") from err
        except RemoteStorageError as err:
            if isinstance(err.__cause__, bexc.ClientError) and _status(err.__cause__) == 404:
                return None
            raise
        return int(r["ContentLength"])

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        token: str | None = None
        n = len(self.key_prefix)
        while True:
            kwargs = {"Bucket": self.bucket, "Prefix": self._k(prefix)}
            if token:
                kwargs["ContinuationToken"] = token
            r = self._call(f"list s3://{self.bucket}/{self._k(prefix)}",
                           lambda kw=kwargs: self.client.list_objects_v2(**kw))
            for o in r.get("Contents", []):
                yield ObjectInfo(o["Key"][n:], int(o["Size"]))
            if not r.get("IsTruncated"):
                return
            token = r["NextContinuationToken"]

    def delete(self, key: str) -> None:
        k = self._k(key)
        self._call(f"delete s3://{self.bucket}/{k}", lambda: self.client.delete_object(Bucket=self.bucket, Key=k))

    def delete_many(self, keys: Iterable[str]) -> None:
        batch: list[str] = []
        for key in keys:
            batch.append(self._k(key))
            if len(batch) == 1000:
                self._delete_batch(batch)
                batch = []
        if batch:
            self._delete_batch(batch)

    def _delete_batch(self, keys: list[str]) -> None:
        r = self._call(f"delete {len(keys)} objects from s3://{self.bucket}", lambda: self.client.delete_objects(
            Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True}))
        errors = [e for e in r.get("Errors", []) if e.get("Code") != "NoSuchKey"]
        if errors:
            raise RemoteStorageError(f"delete from s3://{self.bucket} refused: {errors[:3]}")
