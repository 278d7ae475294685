"""A copy SIGKILLed mid-upload leaves an incomplete S3 multipart upload (invisible, but billed); one GC pass after
the grace aborts it. Against both S3 servers: moto, and s3proxy (whose ListMultipartUploads answers the listing's
time as ``Initiated``, so only the parts tell the upload's age).

The copy runs in a real process (this module run as a script): the storage manager copies a 40 MiB segment to S3
in 5 MiB parts, one at a time and throttled, and is killed with SIGKILL once the store lists a part of it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rlmm.api import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from rlmm.memory import InMemoryRemoteLogMetadataManager as MemRlmm
from rsm.api import LogSegmentData, RemoteSegmentMetadata
from rsm.manager import RemoteStorageManager, RsmConfig
from tests.support.batches import batch
from tests.support.stores import new_bucket, s3_client_for

pytestmark = [pytest.mark.s3, pytest.mark.slow]

MiB = 1024 * 1024
GRACE_MS = 3_000
ROOT = Path(__file__).resolve().parents[3]


def _config(endpoint: str, bucket: str) -> RsmConfig:
    return RsmConfig(store="s3", bucket=bucket, endpoint_url=endpoint, region="us-east-1",
                     part_size_bytes=5 * MiB, upload_concurrency=1, block_size_bytes=1 * MiB,
                     copy_rate_bytes_per_second=4 * MiB)


def _write_segment(d: Path, base: int, n_batches: int, value_bytes: int) -> LogSegmentData:
    """A segment of ``n_batches`` one-record batches of incompressible values."""
    d.mkdir(parents=True)
    log = d / f"{base:020d}.log"
    with open(log, "wb") as f:
        for i in range(n_batches):
            f.write(batch(base + i, [os.urandom(value_bytes)]))
    (d / f"{base:020d}.index").write_bytes(b"")
    (d / f"{base:020d}.timeindex").write_bytes(b"")
    return LogSegmentData(log, d / f"{base:020d}.index", d / f"{base:020d}.timeindex", None, None, b"0\n1\n0 0\n")


def _child(args: dict) -> None:
    """The copy that gets killed: one copy_log_segment_data, as the sidecar's copier runs it."""
    rsm = RemoteStorageManager(_config(args["endpoint"], args["bucket"]))
    d = Path(args["dir"])
    base = args["base"]
    data = LogSegmentData(d / f"{base:020d}.log", d / f"{base:020d}.index", d / f"{base:020d}.timeindex", None,
                          None, b"0\n1\n0 0\n")
    md = RemoteSegmentMetadata(remote_segment_id=uuid.UUID(args["segment_id"]), topic_id=uuid.UUID(args["topic_id"]),
                               topic_name=args["topic"], partition=0, start_offset=base,
                               end_offset_inclusive=base + args["n"] - 1,
                               segment_size_bytes=data.log_path.stat().st_size)
    print("copying", flush=True)
    rsm.copy_log_segment_data(md, data)
    print("finished", flush=True)  # the test kills it long before


def _parts_uploaded(client, bucket: str, prefix: str) -> int:
    uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])
    return sum(len(client.list_parts(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"]).get("Parts", []))
               for u in uploads)


def test_one_gc_pass_after_the_grace_aborts_the_upload_of_a_killed_copy(tmp_path, s3_server):
    from rlm.tasks.gc import GarbageCollector

    client = s3_client_for(s3_server)
    bucket = new_bucket(client)
    tp = TopicIdPartition(uuid.uuid4(), "orders.v2", 0)
    base, n = 100, 160
    _write_segment(tmp_path / "local", base, n, 256 * 1024)  # 40 MiB: 8 parts of 5 MiB, ~10 s at 4 MiB/s
    segment_id = uuid.uuid4()
    rlmm = MemRlmm()
    # What the copier records before the first byte: the copy is in progress, as far as the metadata knows.
    rlmm.add_remote_log_segment_metadata(RemoteLogSegmentMetadata(
        RemoteLogSegmentId(tp, segment_id), base, base + n - 1, 1_700_000_000_000, 1, 1, 40 * MiB, ((0, base),),
        state=RemoteLogSegmentState.COPY_SEGMENT_STARTED))
    rsm = RemoteStorageManager(_config(s3_server, bucket))
    prefix = rsm.partition_prefix(tp.topic, tp.topic_id, 0)
    args = {"endpoint": s3_server, "bucket": bucket, "dir": str(tmp_path / "local"), "base": base, "n": n,
            "segment_id": str(segment_id), "topic_id": str(tp.topic_id), "topic": tp.topic}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-m", "tests.rlm.tasks.test_gc_killed_upload", json.dumps(args)],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while _parts_uploaded(client, bucket, prefix) < 1:
            assert child.poll() is None, f"the copy ended before it was killed:\n{child.stdout.read()}"
            assert time.monotonic() < deadline, "no part of the copy was uploaded within 120 s"
            time.sleep(0.1)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
    assert child.returncode == -signal.SIGKILL
    killed_at_ms = time.time() * 1000
    left = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])
    assert len(left) == 1 and left[0]["Key"].startswith(f"{prefix}{base:020d}-{segment_id}"), left
    assert client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("KeyCount", 0) == 0  # nothing visible

    gc = GarbageCollector(rlmm, rsm, grace_ms=GRACE_MS, state_path=tmp_path / "gc.json")
    # The grace is not over: the upload may belong to a copy still running.
    assert gc.run([tp]) == []
    assert len(client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])) == 1
    # Parts' times have one-second resolution on some servers: wait out the grace and that second.
    time.sleep(max(0.0, (killed_at_ms + GRACE_MS + 1_500 - time.time() * 1000) / 1000))
    deleted = gc.run([tp])  # ONE pass
    assert deleted == [left[0]["Key"]]
    assert client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", []) == []
    rsm.close()


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
