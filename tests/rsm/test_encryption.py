"""Encryption at rest: encrypted copies of segments the real broker wrote, on the filesystem store and on S3 over
HTTP; byte-exact reads, request counts, tampering, key rotation, missing keys; the plain format unchanged."""

from __future__ import annotations

import base64
import json
import pickle
import uuid
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from pydantic import ValidationError

from rsm.api import IndexType
from rsm.encryption import EncryptionConfig, KeyNotConfiguredError, StaticKeyProvider
from rsm.errors import CorruptRemoteObjectError, RemoteStorageError, StoreConfigError
from rsm.format.crypto import (
    SEALED_BLOCK_MAGIC,
    SEALED_INDEX_MAGIC,
    SEALED_OVERHEAD,
    decode_copy_index,
    new_copy_cipher,
)
from rsm.format.index import INDEX_MAGIC, decode_index
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.fs import FileSystemStore
from rsm.store.s3 import S3Store
from rsm.verify import main as verify_main
from rsm.verify import verify_segment
from tests.support.stores import corrupt_byte


def _key(seed: int) -> bytes:
    return bytes((seed * 31 + i * 7) % 256 for i in range(32))


def write_keys(path: Path, keys: dict[str, bytes]) -> Path:
    path.write_text(json.dumps({k: base64.b64encode(v).decode() for k, v in keys.items()}))
    return path


def make_rsm(store, key_file: Path | None = None, active: str | None = None, **config) -> RemoteStorageManager:
    enc = {} if key_file is None else {"key_file": str(key_file)}
    if active is not None:
        enc.update(enabled=True, active_key_id=active)
    return RemoteStorageManager(RsmConfig(**{"block_size_bytes": 16 * 1024, "encryption": enc, **config}), store)


def read_all(stream) -> bytes:
    with stream as f:
        return f.read()


def raw_object(store, key: str) -> bytes:
    return store.get_bytes(key)


# -- unit: keys and configuration (no broker) ----------------------------------------------------------------------


def test_config_is_validated_and_holds_no_key_material(tmp_path, monkeypatch):
    assert RsmConfig().encryption == EncryptionConfig() and not RsmConfig().encryption.enabled
    with pytest.raises(ValidationError, match="active_key_id"):
        EncryptionConfig(enabled=True, key_file=tmp_path / "k.json")
    with pytest.raises(ValidationError, match="key_file or key_env"):
        EncryptionConfig(enabled=True, active_key_id="k1")
    with pytest.raises(ValidationError, match="key id"):
        EncryptionConfig(active_key_id="bad key id")
    with pytest.raises(ValidationError, match="name of an environment variable"):
        EncryptionConfig(key_env=base64.b64encode(_key(1)).decode())
    # Spark passes store options as strings: the section may be JSON
    cfg = RsmConfig(encryption='{"enabled": true, "active_key_id": "k1", "key_env": "RLM_TEST_KEYS"}')
    assert cfg.encryption.active_key_id == "k1"
    # the active key id must be among the keys, and the keys are never quoted in errors
    secret = base64.b64encode(_key(1)).decode()
    monkeypatch.setenv("RLM_TEST_KEYS", json.dumps({"k0": secret}))
    with pytest.raises(StoreConfigError, match="'k1' is not among the configured keys") as exc:
        cfg.encryption.key_provider()
    assert secret not in str(exc.value)
    bad = write_keys(tmp_path / "short.json", {"k1": b"x" * 16})
    with pytest.raises(StoreConfigError, match="16 bytes, expected 32") as exc:
        EncryptionConfig(key_file=bad).key_provider()
    (tmp_path / "broken.json").write_text('{"k1": "' + secret + '"')  # truncated JSON
    with pytest.raises(StoreConfigError, match="broken.json") as exc:
        EncryptionConfig(key_file=tmp_path / "broken.json").key_provider()
    assert secret not in str(exc.value)
    with pytest.raises(StoreConfigError, match="not set in the environment"):
        EncryptionConfig(key_env="RLM_TEST_UNSET_VARIABLE").key_provider()
    # file and variable merge; the same key id must have the same key in both
    f = write_keys(tmp_path / "keys.json", {"k1": _key(1)})
    assert EncryptionConfig(key_file=f, key_env="RLM_TEST_KEYS").key_provider().key_ids() == ["k0", "k1"]
    monkeypatch.setenv("RLM_TEST_KEYS", json.dumps({"k1": base64.b64encode(_key(5)).decode()}))
    with pytest.raises(StoreConfigError, match="differs"):
        EncryptionConfig(key_file=f, key_env="RLM_TEST_KEYS").key_provider()


def test_key_file_open_to_others_is_warned_about_and_the_config_round_trips(tmp_path, caplog):
    f = write_keys(tmp_path / "keys.json", {"k1": _key(1)})
    f.chmod(0o644)
    with caplog.at_level("WARNING", logger="rsm.encryption"):
        EncryptionConfig(key_file=f).key_provider()
    assert "accessible to group or others (mode 644)" in caplog.text and str(f) in caplog.text
    assert base64.b64encode(_key(1)).decode() not in caplog.text
    caplog.clear()
    f.chmod(0o600)
    with caplog.at_level("WARNING", logger="rsm.encryption"):
        EncryptionConfig(key_file=f).key_provider()
    assert caplog.text == ""
    # what Spark's config option ships to executors: the dumped store section rebuilds the same config
    cfg = RsmConfig(root_path=tmp_path, encryption={"enabled": True, "active_key_id": "k1", "key_file": str(f)})
    assert RsmConfig(**json.loads(json.dumps(cfg.model_dump(mode="json")))) == cfg


def test_key_material_stays_out_of_repr_dumps_and_pickles(tmp_path):
    kek = _key(3)
    f = write_keys(tmp_path / "keys.json", {"k3": kek})
    cfg = RsmConfig(root_path=tmp_path, encryption={"enabled": True, "active_key_id": "k3", "key_file": str(f)})
    rsm = RemoteStorageManager(cfg)
    provider = rsm.key_provider
    cipher = new_copy_cipher(provider, "k3", key_base="t-x/0/00000000000000000000-x")
    texts = [repr(cfg), json.dumps(cfg.model_dump(mode="json")), repr(provider), str(provider), repr(cipher)]
    for text in texts:
        for form in (kek.hex(), base64.b64encode(kek).decode(), repr(kek)):
            assert form not in text, text
    assert "k3" in repr(provider) and "k3" in repr(cipher)
    for obj in (provider, cipher):
        with pytest.raises(TypeError, match="not pickled"):
            pickle.dumps(obj)
    # what Spark ships to executors: the configuration, which names where the keys are, not the keys
    shipped = pickle.dumps(cfg.model_dump(mode="json"))
    assert kek not in shipped and base64.b64encode(kek) not in shipped


def test_sealed_parts_are_bound_to_their_place():
    provider = StaticKeyProvider({"k1": _key(1)})
    cipher = new_copy_cipher(provider, "k1", key_base="base-a")
    sealed = bytes(cipher.seal_block(b"hello block", ledger_id=7, object_number=0, position=4096))
    assert len(sealed) == len(b"hello block") + SEALED_OVERHEAD
    assert int.from_bytes(sealed[:4], "big") == SEALED_BLOCK_MAGIC
    assert cipher.open_block(sealed, key="k", ledger_id=7, object_number=0, position=4096, part_id=3) == b"hello block"
    into = bytearray(64)
    assert bytes(cipher.open_block(sealed, key="k", ledger_id=7, object_number=0, position=4096, part_id=3,
                                   into=into)) == b"hello block" == into[:11]
    for ledger_id, obj, pos in ((8, 0, 4096), (7, 1, 4096), (7, 0, 4097)):  # another ledger, object, position
        with pytest.raises(CorruptRemoteObjectError, match="block 3 .*fails authentication") as exc:
            cipher.open_block(sealed, key="obj-key", ledger_id=ledger_id, object_number=obj, position=pos,
                              part_id=3)
        assert exc.value.key == "obj-key"
    with pytest.raises(CorruptRemoteObjectError, match="block 3"):  # truncated
        cipher.open_block(sealed[:-1], key="k", ledger_id=7, object_number=0, position=4096, part_id=3)
    # A block that fails authentication leaves nothing of its plaintext in a reused buffer (AES-GCM's decrypt_into
    # writes the plaintext before it checks the tag).
    flipped = bytearray(sealed)
    flipped[-1] ^= 1
    reused = bytearray(64)
    with pytest.raises(CorruptRemoteObjectError, match="fails authentication"):
        cipher.open_block(bytes(flipped), key="k", ledger_id=7, object_number=0, position=4096, part_id=3,
                          into=reused)
    assert b"hello" not in reused and reused[:11] == bytes(11)
    # nonces never repeat under one data key
    again = bytes(cipher.seal_block(b"hello block", ledger_id=7, object_number=0, position=4096))
    assert again[4:16] != sealed[4:16] and again[16:] != sealed[16:]
    # a section cannot stand in for a block (its own magic and associated data)
    section = b"".join(cipher.seal_section([b"hello block"], ledger_id=7, object_number=0, position=4096))
    with pytest.raises(CorruptRemoteObjectError, match="bad magic"):
        cipher.open_block(section, key="k", ledger_id=7, object_number=0, position=4096, part_id=3)
    assert cipher.open_section(section, key="k", ledger_id=7, object_number=0, position=4096,
                               what="s") == b"hello block"
    # a sealed index object of one copy does not open as another copy's (the key base is bound)
    from rsm.format.index import IndexObject, encode_index

    plain = encode_index(IndexObject(0, 128, ()))
    sealed_index = cipher.seal_index(plain, key_base="base-a")
    assert decode_copy_index(sealed_index, key="a-index", key_base="base-a", provider=provider).ledgers == ()
    with pytest.raises(CorruptRemoteObjectError, match="b-index"):
        decode_copy_index(sealed_index, key="b-index", key_base="base-b", provider=provider)


# -- real broker segments, fs and S3 -------------------------------------------------------------------------------

@pytest.fixture(params=["fs", "s3"])
def store(request, tmp_path):
    if request.param == "fs":
        yield FileSystemStore(tmp_path / "remote")
        return
    endpoint = request.getfixturevalue("s3_endpoint")
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          config=Config(request_checksum_calculation="when_required",
                                        response_checksum_validation="when_required"))
    bucket = f"enc-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    s3 = S3Store(bucket, endpoint_url=endpoint, region_name="us-east-1", part_size_bytes=5 * 1024 * 1024)
    yield s3
    s3.close()


@pytest.fixture
def key_file(tmp_path) -> Path:
    return write_keys(tmp_path / "keys.json", {"k1": _key(1)})


@pytest.mark.kafka
def test_encrypted_copies_read_byte_exact(store, broker_segments, key_file):
    rsm = make_rsm(store, key_file, "k1")
    for seg in broker_segments:
        md = seg.metadata()
        rsm.copy_log_segment_data(md, seg.data)
        keys = rsm.keys(md)
        local = seg.data.log_path.read_bytes()
        # nothing stored in the clear: the index is sealed, no batch appears in the data object
        index_raw = raw_object(store, keys.index)
        assert int.from_bytes(index_raw[:4], "big") == SEALED_INDEX_MAGIC
        stored = raw_object(store, keys.data(0))
        for h in seg.batches[:3]:
            assert local[h.position + 61:h.end_position] not in stored
        fresh = make_rsm(store, key_file)  # reads need the keys, not enabled
        assert read_all(fresh.fetch_log_segment(md, 0)) == local
        h = seg.batches[len(seg.batches) // 2]
        assert read_all(fresh.fetch_log_segment(md, h.position + 5, h.end_position + 9)) == \
            local[h.position + 5:h.end_position + 10]
        d = seg.data
        assert read_all(fresh.fetch_index(md, IndexType.OFFSET)) == d.offset_index_path.read_bytes()
        assert read_all(fresh.fetch_index(md, IndexType.TIMESTAMP)) == d.time_index_path.read_bytes()
        assert read_all(fresh.fetch_index(md, IndexType.LEADER_EPOCH)) == d.leader_epoch_checkpoint
        if d.producer_snapshot_path is not None:
            assert read_all(fresh.fetch_index(md, IndexType.PRODUCER_SNAPSHOT)) == \
                d.producer_snapshot_path.read_bytes()
        if d.transaction_index_path is not None:
            assert read_all(fresh.fetch_index(md, IndexType.TRANSACTION)) == d.transaction_index_path.read_bytes()
            assert fresh.open_segment(md).aborted_transactions()
        report = fresh.verify_copy(md)
        assert report.ok and report.entries == len(seg.batches), str(report)
        # batches through the SegmentHandle (what the sidecar's reader and Spark use), every view held until the
        # end (an opened block is a fresh buffer: a later block never overwrites the batches of an earlier one)
        views = [data for _, data in fresh.open_segment(md).batches(seg.base_offset, seg.end_offset_inclusive)]
        assert b"".join(bytes(v) for v in views) == local
        # rebuilt from the store alone (recovery) through the sealed index
        meta = fresh.load_index(keys).metadata
        assert meta.entry_count == len(seg.batches) and meta.remote_segment_id == md.remote_segment_id


@pytest.mark.kafka
def test_spanning_encrypted_copy(store, broker_segments, key_file):
    seg = max(broker_segments, key=lambda s: s.data.log_path.stat().st_size)
    md = seg.metadata()
    rsm = make_rsm(store, key_file, "k1", block_size_bytes=2048, max_data_object_bytes=8192)
    rsm.copy_log_segment_data(md, seg.data)
    keys = rsm.keys(md)
    assert keys.data(2) in [o.key for o in store.list(keys.prefix)]
    fresh = make_rsm(store, key_file)
    local = seg.data.log_path.read_bytes()
    assert read_all(fresh.fetch_log_segment(md, 0)) == local
    assert read_all(fresh.fetch_index(md, IndexType.OFFSET)) == seg.data.offset_index_path.read_bytes()
    assert verify_segment(store, keys, key_provider=fresh.key_provider).ok


@pytest.mark.kafka
def test_a_block_that_fails_to_seal_fails_the_copy_with_nothing_left(store, broker_segments, key_file,
                                                                      monkeypatch):
    """Blocks are sealed one ahead on the worker pool (:class:`BlockSealer`): an error there fails the copy as any
    other, nothing left in the store, and the next copy works."""
    import threading

    from rsm.format.crypto import CopyCipher

    seg = max(broker_segments, key=lambda s: s.data.log_path.stat().st_size)
    rsm = make_rsm(store, key_file, "k1", block_size_bytes=2048)
    real = CopyCipher._seal_into
    threads: set[str] = set()
    calls = [0]

    def flaky(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        threads.add(threading.current_thread().name)
        calls[0] += 1
        if calls[0] == 3:
            raise OSError("injected sealing failure")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CopyCipher, "_seal_into", flaky)
    md = seg.metadata()
    with pytest.raises(RemoteStorageError, match="injected sealing failure"):
        rsm.copy_log_segment_data(md, seg.data)
    assert list(store.list(rsm.keys(md).prefix)) == []
    assert threads and all(t.startswith("rsm-aes") for t in threads), threads
    md = seg.metadata(uuid.uuid4())
    rsm.copy_log_segment_data(md, seg.data)
    assert read_all(make_rsm(store, key_file).fetch_log_segment(md, 0)) == seg.data.log_path.read_bytes()


@pytest.mark.kafka
def test_a_sequential_read_reuses_opened_block_buffers_no_view_holds(store, broker_segments, key_file,
                                                                     monkeypatch):
    """An opened block's buffer is reused once no batch view of it is alive (a fresh 4 MiB buffer per block costs
    its zero-fill), and never while one is: held views stay intact (test_encrypted_copies_read_byte_exact)."""
    from rsm.format import reader

    seg = max(broker_segments, key=lambda s: s.data.log_path.stat().st_size)
    md = seg.metadata()
    # about a block a batch (the largest batch fits a block: none is cut into fragments)
    block_size = 128 + 12 + max(b.size_bytes for b in seg.batches)
    make_rsm(store, key_file, "k1", block_size_bytes=block_size).copy_log_segment_data(md, seg.data)
    fresh = make_rsm(store, key_file)
    blocks = len(fresh.reader(md).ledger.blocks)
    assert blocks >= 6
    made = [0]

    def counting_bytearray(*args):  # type: ignore[no-untyped-def]
        made[0] += bool(args and args[0])  # buffers with room in them, not the empty placeholders
        return bytearray(*args)

    monkeypatch.setattr(reader, "bytearray", counting_bytearray, raising=False)  # the reader module's buffers
    assert read_all(fresh.fetch_log_segment(md, 0)) == seg.data.log_path.read_bytes()
    # two sealed buffers taking turns, at most three opened ones (this block, the next, the one before)
    assert made[0] <= 2 + 3 < 2 + blocks, (made[0], blocks)
    made[0] = 0
    held = [data for _, data in fresh.open_segment(md).batches(seg.base_offset, seg.end_offset_inclusive)]
    assert made[0] == 2 + blocks  # every block's views held: no opened buffer reused
    assert b"".join(bytes(v) for v in held) == seg.data.log_path.read_bytes()


@pytest.mark.kafka
def test_cold_random_read_is_two_requests_warm_one(store, broker_segments, key_file):
    seg = broker_segments[0]
    md = seg.metadata()
    make_rsm(store, key_file, "k1").copy_log_segment_data(md, seg.data)
    local = seg.data.log_path.read_bytes()
    h = seg.batches[len(seg.batches) // 2]
    cold = make_rsm(store, key_file, "k1")
    before = store.requests.total()
    assert read_all(cold.fetch_log_segment(md, h.position, h.end_position - 1)) == local[h.position:h.end_position]
    assert store.requests.total() - before == 2
    assert len(cold.reader(md).ledger.blocks) > 2  # the read above fetched one block of several
    h2 = seg.batches[-1]
    before = store.requests.total()
    assert read_all(cold.fetch_log_segment(md, h2.position, h2.end_position - 1)) == local[h2.position:]
    assert store.requests.total() - before == 1


@pytest.mark.kafka
def test_flipped_byte_in_a_block_names_the_key_and_block(store, broker_segments, key_file):
    seg = broker_segments[0]
    md = seg.metadata()
    rsm = make_rsm(store, key_file, "k1")
    rsm.copy_log_segment_data(md, seg.data)
    keys = rsm.keys(md)
    block = rsm.reader(md).ledger.blocks[1]
    corrupt_byte(store, keys.data(0), block.object_position + 128 + 40)  # inside the sealed second block
    fresh = make_rsm(store, key_file)
    with pytest.raises(CorruptRemoteObjectError, match=r"block 1 .*fails authentication") as exc:
        read_all(fresh.fetch_log_segment(md, block.log_position))
    assert exc.value.key == keys.data(0) and exc.value.position == block.object_position
    assert keys.data(0) in str(exc.value)
    report = verify_segment(store, keys, key_provider=fresh.key_provider)
    assert not report.ok and report.bad_key == keys.data(0) and "block 1" in report.message
    # the block before is intact and still served
    local = seg.data.log_path.read_bytes()
    assert read_all(fresh.fetch_log_segment(md, 0, block.log_position - 1)) == local[:block.log_position]


@pytest.mark.kafka
def test_flipped_byte_in_the_index_object_or_a_section_names_the_key(store, broker_segments, key_file):
    seg = broker_segments[1]
    md = seg.metadata()
    rsm = make_rsm(store, key_file, "k1")
    rsm.copy_log_segment_data(md, seg.data)
    keys = rsm.keys(md)
    section = rsm.reader(md).ledger.section(IndexType.OFFSET)
    corrupt_byte(store, keys.data(0), section.position + 20)
    with pytest.raises(CorruptRemoteObjectError, match="OFFSET index section .*fails authentication") as exc:
        make_rsm(store, key_file).fetch_index(md, IndexType.OFFSET)
    assert exc.value.key == keys.data(0)
    size = len(raw_object(store, keys.index))
    for position in (size - 1, size // 2, 8):  # the tag, the sealed index, the wrapped data key
        corrupt_byte(store, keys.index, position)
        with pytest.raises(CorruptRemoteObjectError) as exc:
            make_rsm(store, key_file).fetch_log_segment(md, 0)
        assert exc.value.key == keys.index and keys.index in str(exc.value)
        report = verify_segment(store, keys, key_provider=rsm.key_provider)
        assert not report.ok and report.bad_key == keys.index
        corrupt_byte(store, keys.index, position)  # back
    assert read_all(make_rsm(store, key_file).fetch_log_segment(md, 0)) == seg.data.log_path.read_bytes()


@pytest.mark.kafka
def test_a_block_replayed_from_another_copy_fails(store, broker_segments, key_file):
    """Two copies of the same segment have the same layout; a sealed block of one put in place of the other's at
    the same position is refused (each copy has its own data key)."""
    seg = broker_segments[2]
    rsm = make_rsm(store, key_file, "k1")
    md1, md2 = seg.metadata(), seg.metadata()
    rsm.copy_log_segment_data(md1, seg.data)
    rsm.copy_log_segment_data(md2, seg.data)
    b1, b2 = rsm.reader(md1).ledger.blocks[0], rsm.reader(md2).ledger.blocks[0]
    assert (b1.object_position, b1.block_length) == (b2.object_position, b2.block_length)
    k1, k2 = rsm.keys(md1).data(0), rsm.keys(md2).data(0)
    one, two = bytearray(raw_object(store, k1)), bytearray(raw_object(store, k2))
    two[:b1.block_length] = one[:b1.block_length]
    store.put(k2, [bytes(two)])
    with pytest.raises(CorruptRemoteObjectError, match="block 0") as exc:
        read_all(make_rsm(store, key_file).fetch_log_segment(md2, 0))
    assert exc.value.key == k2


@pytest.mark.kafka
def test_key_rotation_and_a_key_no_longer_configured(store, broker_segments, tmp_path):
    seg_a, seg_b = broker_segments[0], broker_segments[3]
    md_a, md_b = seg_a.metadata(), seg_b.metadata()
    f = write_keys(tmp_path / "keys.json", {"k1": _key(1)})
    make_rsm(store, f, "k1").copy_log_segment_data(md_a, seg_a.data)
    # rotation: a new key id is added and made active; the old one stays
    write_keys(f, {"k1": _key(1), "k2": _key(2)})
    rotated = make_rsm(store, f, "k2")
    rotated.copy_log_segment_data(md_b, seg_b.data)
    fresh = make_rsm(store, f, "k2")
    assert fresh.reader(md_a).ledger.cipher.key_id == "k1"
    assert fresh.reader(md_b).ledger.cipher.key_id == "k2"
    assert read_all(fresh.fetch_log_segment(md_a, 0)) == seg_a.data.log_path.read_bytes()
    assert read_all(fresh.fetch_log_segment(md_b, 0)) == seg_b.data.log_path.read_bytes()
    # k1 removed: the copy written under it fails naming the key id; the k2 copy still reads
    write_keys(f, {"k2": _key(2)})
    without = make_rsm(store, f, "k2")
    with pytest.raises(KeyNotConfiguredError, match="key id 'k1'") as exc:
        without.fetch_log_segment(md_a, 0)
    assert exc.value.key_id == "k1" and without.keys(md_a).index in str(exc.value)
    with pytest.raises(KeyNotConfiguredError, match="key id 'k1'"):
        without.verify_copy(md_a)
    assert read_all(without.fetch_log_segment(md_b, 0)) == seg_b.data.log_path.read_bytes()
    # a reader with no keys at all: a clear error naming the key id, never a misread
    with pytest.raises(KeyNotConfiguredError, match="key id 'k2' and no encryption keys are configured"):
        make_rsm(store).fetch_log_segment(md_b, 0)
    # a different key under the same id: the wrapped data key does not authenticate
    write_keys(f, {"k2": _key(9)})
    with pytest.raises(CorruptRemoteObjectError, match="wrapped data key"):
        make_rsm(store, f).fetch_log_segment(md_b, 0)
    # a reader that knows only the plain format refuses the sealed index by its magic
    with pytest.raises(CorruptRemoteObjectError, match="bad index magic"):
        decode_index(raw_object(store, without.keys(md_b).index), key="x")


@pytest.mark.kafka
def test_plain_copies_are_byte_identical_and_stay_readable(tmp_path, broker_segments, key_file):
    """Keys configured but encryption off: the objects are exactly those of a manager without any encryption
    configuration; and a manager encrypting new copies still reads the plain ones."""
    seg = broker_segments[4]
    md = seg.metadata(uuid.UUID(int=42))
    plain_store, keyed_store = FileSystemStore(tmp_path / "a"), FileSystemStore(tmp_path / "b")
    RemoteStorageManager(RsmConfig(block_size_bytes=16 * 1024), plain_store).copy_log_segment_data(md, seg.data)
    make_rsm(keyed_store, key_file).copy_log_segment_data(md, seg.data)
    objects = sorted(o.key for o in plain_store.list(""))
    assert objects == sorted(o.key for o in keyed_store.list(""))
    for key in objects:
        assert plain_store.get_bytes(key) == keyed_store.get_bytes(key), key
    index_raw = plain_store.get_bytes(objects[-1] if objects[-1].endswith("-index") else objects[0])
    assert int.from_bytes(index_raw[:4], "big") == INDEX_MAGIC
    # encrypting new copies with plain ones left from before: the migration flag (require_encrypted: false)
    encrypting = RemoteStorageManager(RsmConfig(block_size_bytes=16 * 1024, encryption={
        "enabled": True, "active_key_id": "k1", "key_file": str(key_file), "require_encrypted": False}), plain_store)
    assert read_all(encrypting.fetch_log_segment(md, 0)) == seg.data.log_path.read_bytes()
    assert encrypting.reader(md).ledger.cipher is None
    # without it (the default once enabled), a plain copy is refused (one put in place of an encrypted one)
    strict = make_rsm(plain_store, key_file, "k1")
    assert strict.config.encryption.require_encrypted
    with pytest.raises(CorruptRemoteObjectError, match="not encrypted and store.encryption.require_encrypted") as exc:
        strict.fetch_log_segment(md, 0)
    assert exc.value.key == strict.keys(md).index
    report = strict.verify_copy(md)
    assert not report.ok and "require_encrypted" in report.message
    md2 = seg.metadata()
    strict.copy_log_segment_data(md2, seg.data)  # encrypted copies read as usual (a fresh manager: no cache)
    fresh_strict = RemoteStorageManager(strict.config, plain_store)
    assert read_all(fresh_strict.fetch_log_segment(md2, 0)) == seg.data.log_path.read_bytes()


@pytest.mark.kafka
def test_verify_cli_with_a_key_file(tmp_path, broker_segments, key_file, capsys):
    store = FileSystemStore(tmp_path / "remote")
    seg = broker_segments[0]
    md = seg.metadata()
    make_rsm(store, key_file, "k1").copy_log_segment_data(md, seg.data)
    assert verify_main(["--root", str(store.root), "--key-file", str(key_file)]) == 0
    assert "OK" in capsys.readouterr().out
    with pytest.raises(KeyNotConfiguredError, match="key id 'k1'"):
        verify_main(["--root", str(store.root)])


def test_a_kms_like_key_provider_plugs_in_behind_the_interface():
    """A provider that never hands out its KEK (as a KMS: wrap/unwrap by key id with an encryption context) seals
    and opens copies through the same calls; a wrong context is refused by the provider."""
    from rsm.encryption import KeyProvider, UnwrapError
    from rsm.format.index import IndexObject, encode_index

    class FakeKms(KeyProvider):
        def __init__(self) -> None:
            self._aead = {"arn:aws:kms:eu-west-1:1:key/abc": StaticKeyProvider({"x": _key(4)})}
            self.calls: list[tuple[str, bytes]] = []

        def has_key(self, key_id: str) -> bool:
            return key_id in self._aead

        def wrap(self, key_id: str, dek: bytes, context: bytes) -> bytes:
            self.calls.append(("wrap", context))
            return self._aead[key_id].wrap("x", dek, context)

        def unwrap(self, key_id: str, wrapped: bytes, context: bytes) -> bytes:
            self.calls.append(("unwrap", context))
            try:
                return self._aead[key_id].unwrap("x", wrapped, context)
            except UnwrapError as err:
                raise UnwrapError(f"KMS refused: {err}") from None

    kms = FakeKms()
    kid = "arn:aws:kms:eu-west-1:1:key/abc"
    cipher = new_copy_cipher(kms, kid, key_base="t/0/base")
    sealed = cipher.seal_index(encode_index(IndexObject(0, 128, ())), key_base="t/0/base")
    index = decode_copy_index(sealed, key="t/0/base-index", key_base="t/0/base", provider=kms)
    assert index.ledgers == () and kms.calls == [("wrap", b"t/0/base"), ("unwrap", b"t/0/base")]
    with pytest.raises(CorruptRemoteObjectError, match="KMS refused"):
        decode_copy_index(sealed, key="t/0/other-index", key_base="t/0/other", provider=kms)
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(kms)


@pytest.mark.kafka
def test_offload_segment_copy_is_encrypted_too(tmp_path, broker_segments, key_file):
    """``copy_log_range`` (PIP-76 offload segments, indexes built while copying) goes through the same sealing."""
    from dataclasses import replace

    from rsm.api import LogPiece, LogRangeData
    from rsm.log.batch import iter_batches_with_bytes

    store = FileSystemStore(tmp_path / "remote")
    rsm = make_rsm(store, key_file, "k1")
    a, b = broker_segments[1], broker_segments[2]
    tail = list(iter_batches_with_bytes(a.data.log_path))[3:]
    head = list(iter_batches_with_bytes(b.data.log_path))[:5]
    pieces = (LogPiece(a.data.log_path, tail[0][0].position, tail[-1][0].end_position),
              LogPiece(b.data.log_path, 0, head[-1][0].end_position))
    md = replace(a.metadata(), start_offset=tail[0][0].base_offset, end_offset_inclusive=head[-1][0].last_offset,
                 segment_size_bytes=sum(p.end_position - p.start_position for p in pieces))
    rsm.copy_log_range(md, LogRangeData(pieces, None, a.data.leader_epoch_checkpoint))
    keys = rsm.keys(md)
    assert int.from_bytes(raw_object(store, keys.index)[:4], "big") == SEALED_INDEX_MAGIC
    fresh = make_rsm(store, key_file)
    assert read_all(fresh.fetch_log_segment(md, 0)) == b"".join(bytes(raw) for _h, raw in tail + head)
    assert len(read_all(fresh.fetch_index(md, IndexType.TIMESTAMP))) % 12 == 0
    assert fresh.verify_copy(md).ok
