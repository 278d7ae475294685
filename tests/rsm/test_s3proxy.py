"""What the s3proxy fixture gives the suite (devtools/s3proxy.py): a real S3 server that checks signatures,
answers ranged GETs with 206, completes multipart uploads and lists incomplete ones; and the one thing it does not
do like S3 (``Initiated`` of an incomplete upload is the listing's time), which :class:`S3Store` copes with."""

from __future__ import annotations

import time
import uuid

import boto3
import botocore.exceptions as bexc
import pytest
from botocore.config import Config

from rsm.store.s3 import S3Store
from tests.support.stores import new_bucket, s3_client_for

pytestmark = [pytest.mark.s3]

MiB = 1024 * 1024


def test_ranged_get_is_206_and_signatures_are_checked(s3proxy_endpoint):
    client = s3_client_for(s3proxy_endpoint)
    bucket = new_bucket(client)
    client.put_object(Bucket=bucket, Key="a/b", Body=bytes(range(256)) * 4)
    r = client.get_object(Bucket=bucket, Key="a/b", Range="bytes=10-19")
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert r["Body"].read() == bytes(range(10, 20)) and r["ContentRange"] == "bytes 10-19/1024"
    wrong = boto3.client("s3", endpoint_url=s3proxy_endpoint, region_name="us-east-1",
                         aws_access_key_id="testing", aws_secret_access_key="not-the-secret",
                         config=Config(s3={"addressing_style": "path"}))
    with pytest.raises(bexc.ClientError) as exc:
        wrong.get_object(Bucket=bucket, Key="a/b")
    assert exc.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_multipart_upload_and_listing_incomplete_uploads(s3proxy_endpoint):
    client = s3_client_for(s3proxy_endpoint)
    bucket = new_bucket(client)
    store = S3Store(bucket, endpoint_url=s3proxy_endpoint, region_name="us-east-1", part_size_bytes=5 * MiB,
                    upload_concurrency=2)
    data = bytes(range(256)) * (45 * 1024)  # 11.25 MiB: three parts
    assert store.put("p/whole", [data[i:i + MiB] for i in range(0, len(data), MiB)]) == len(data)
    counts = store.requests.snapshot()
    assert counts.get("UploadPart") == 3 and counts.get("CompleteMultipartUpload") == 1, counts
    assert store.get_bytes("p/whole") == data and store.get_bytes("p/whole", 5 * MiB - 3, 5 * MiB + 2) == \
        data[5 * MiB - 3:5 * MiB + 3]

    up = client.create_multipart_upload(Bucket=bucket, Key="p/killed")["UploadId"]
    client.upload_part(Bucket=bucket, Key="p/killed", UploadId=up, PartNumber=1, Body=b"x" * (5 * MiB))
    other = client.create_multipart_upload(Bucket=bucket, Key="q/other")["UploadId"]
    listed = client.list_multipart_uploads(Bucket=bucket, Prefix="p/")["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in listed] == [("p/killed", up)]
    # s3proxy 2.6 reports the listing's own time as Initiated, not the upload's:
    time.sleep(1.2)
    again = client.list_multipart_uploads(Bucket=bucket, Prefix="p/")["Uploads"]
    assert again[0]["Initiated"] > listed[0]["Initiated"]
    # ... so the parts tell the age: the upload is stale once its newest part is older than the cutoff.
    assert store.abort_stale_uploads("p/", int(time.time() * 1000) - 60_000) == []
    # (1.2 s after the part: its LastModified, to the second, is before now - 0.1 s; Initiated is now.)
    assert store.abort_stale_uploads("p/", int(time.time() * 1000) - 100) == ["p/killed"]
    # An upload without parts whose Initiated cannot be believed has no known age: left to the lifecycle rule
    # (on S3, q/other would be aborted here: it was initiated more than 1.2 s ago).
    assert store.abort_stale_uploads("q/", int(time.time() * 1000) - 100) == []
    left = client.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in left] == [("q/other", other)]
    # Nothing of an incomplete upload is visible under its key's prefix.
    assert [o.key for o in store.list("p/")] == ["p/whole"]
    store.close()


def test_delete_many_against_s3proxy(s3proxy_endpoint):
    """DeleteObjects goes with Content-MD5 (s3proxy answers 501 NotImplemented to botocore's CRC32 header)."""
    client = s3_client_for(s3proxy_endpoint)
    bucket = new_bucket(client)
    store = S3Store(bucket, endpoint_url=s3proxy_endpoint, region_name="us-east-1")
    keys = [f"d/{uuid.uuid4()}" for _ in range(5)]
    for k in keys:
        store.put(k, [b"x"])
    store.delete_many([*keys[:3], "d/never-there"])
    assert sorted(o.key for o in store.list("d/")) == sorted(keys[3:])


def test_a_server_that_cannot_start_is_an_error_with_its_log(tmp_path):
    """What the fixture turns into a test failure (never a skip): the exit code and s3proxy's own words."""
    from devtools.s3proxy import S3ProxyServer, S3ProxyStartError

    server = S3ProxyServer(provider="no-such-provider", directory=tmp_path)
    with pytest.raises(S3ProxyStartError, match="exited with code") as exc:
        server.start()
    assert "no-such-provider" in str(exc.value)
    assert server.process is None
