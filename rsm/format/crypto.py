"""Encrypted copies: the sealed index object, sealed blocks and sections (AES-256-GCM, ``cryptography``).

An encrypted copy has the same objects, keys and structure as a plain one (:mod:`rsm.format.index`,
:mod:`rsm.format.block`); each object part is *sealed*, one AES-256-GCM message per part, under the copy's own
random 256-bit data key (DEK):

- each data block is one message, so one ranged GET still fetches (and authenticates) exactly one block;
- each of Kafka's index sections (``.index``, ``.timeindex`` ...) in a data object is one message;
- the index object is one message, behind a clear header holding the key id and the wrapped DEK
  (:class:`rsm.encryption.KeyProvider`). The plain index inside records the *sealed* lengths and positions, so
  readers locate parts exactly as in a plain copy.

Nonces never repeat under one DEK: a DEK is fresh for each copy attempt and its messages take nonces 1, 2, 3 ...
(a 96-bit big-endian counter), stored with each message. The associated data binds each message to its place:
a block or section to its kind, the ledger id, the data object number and its position in that object; the index
object to the copy's key base. A part moved, swapped or replayed from elsewhere fails authentication, as does any
flipped or missing byte: :class:`CorruptRemoteObjectError` naming the object key, the position and the block.

Layout (big-endian)::

    SealedIndexObject =>                    (at the copy's index key, in place of IndexObject)
      magic => uint32                       (0x3D1FE5C1; not INDEX_MAGIC: a reader without keys never decodes it)
      version => uint8                      (1)
      key_id_len => uint8
      key_id => utf-8 bytes                 (the KEK that wrapped the DEK)
      wrapped_dek_len => uint16
      wrapped_dek => bytes                  (KeyProvider.wrap(key_id, DEK, context = key base, utf-8))
      nonce => 12 bytes
      sealed_index => bytes                 (AES-256-GCM(DEK) of the plain IndexObject, then the 16-byte tag)
      associated data: every byte before sealed_index, then the copy's key base (utf-8)

    SealedPart =>                           (a data block or a section, in a data object)
      magic => uint32                       (0x26A6E5C1 block, 0x5EC7E5C1 section; neither is BLOCK_MAGIC)
      nonce => 12 bytes
      sealed => bytes                       (AES-256-GCM(DEK) of the plain block / section, then the 16-byte tag)
      associated data: magic uint32, ledger_id int64, object_number int32, position int64 (of the SealedPart in
      its data object)

A sealed part is :data:`SEALED_OVERHEAD` (32) bytes longer than the plain one.
"""

from __future__ import annotations

import itertools
import os
import struct
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import replace

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from rsm.encryption import KeyNotConfiguredError, KeyProvider, UnwrapError
from rsm.errors import CorruptRemoteObjectError
from rsm.format.block import BLOCK_MAGIC
from rsm.format.index import IndexObject, decode_index

__all__ = [
    "SEALED_BLOCK_MAGIC",
    "SEALED_INDEX_MAGIC",
    "SEALED_OVERHEAD",
    "SEALED_SECTION_MAGIC",
    "BlockSealer",
    "CopyCipher",
    "decode_copy_index",
    "is_sealed_index",
    "new_copy_cipher",
    "worker_pool",
]

SEALED_INDEX_MAGIC = 0x3D1FE5C1
SEALED_BLOCK_MAGIC = 0x26A6E5C1
SEALED_SECTION_MAGIC = 0x5EC7E5C1
SEALED_INDEX_VERSION = 1
DEK_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16

_INDEX_HEAD = struct.Struct(
    ">"
    "I"  # magic
    "B"  # version
    "B"  # key_id_len
)
_WRAPPED_LEN = struct.Struct(">H")  # wrapped_dek_len
_PART_HEAD = struct.Struct(
    ">"
    "I"    # magic
    "12s"  # nonce
)
_PART_AD = struct.Struct(
    ">"
    "I"  # magic
    "q"  # ledger_id
    "i"  # object_number
    "q"  # position
)
SEALED_OVERHEAD = _PART_HEAD.size + TAG_BYTES  # 32
_NAMES = {SEALED_BLOCK_MAGIC: "block", SEALED_SECTION_MAGIC: "section"}


def is_sealed_index(data: bytes | memoryview) -> bool:
    """Whether ``data`` (an index object's bytes) is a sealed (encrypted) index object."""
    return len(data) >= 4 and int.from_bytes(data[:4], "big") == SEALED_INDEX_MAGIC


class CopyCipher:
    """One copy's data key: seals (when writing the copy) and opens (when reading it) its parts. Not pickled, its
    ``repr`` shows only the key id. Thread-safe."""

    __slots__ = ("_aead", "_dek", "_nonces", "_wrapped", "key_id")

    def __init__(self, dek: bytes, key_id: str, wrapped: bytes) -> None:
        if len(dek) != DEK_BYTES:
            raise ValueError(f"a data key is {DEK_BYTES} bytes, got {len(dek)}")
        self._dek = dek
        self._aead = AESGCM(dek)
        self._wrapped = wrapped
        self._nonces = itertools.count(1)  # next() is atomic: nonces stay unique across threads
        self.key_id = key_id

    def __repr__(self) -> str:
        return f"CopyCipher(key_id={self.key_id!r})"

    def __reduce__(self):  # noqa: D105
        raise TypeError("CopyCipher holds a data key and is not pickled")

    def _nonce(self) -> bytes:
        return next(self._nonces).to_bytes(NONCE_BYTES, "big")

    # -- sealing -----------------------------------------------------------------------------------------------

    def seal_block(self, plain: bytes | bytearray | memoryview, *, ledger_id: int, object_number: int,
                   position: int, into: bytearray | None = None) -> memoryview:
        """The sealed block (:data:`SEALED_OVERHEAD` bytes longer) of a plain block, to be written at ``position``
        of data object ``object_number``; in ``into`` when it is large enough (no allocation), else in a new
        buffer. Thread-safe (each call takes its own nonce); :class:`BlockSealer` runs it on a worker thread."""
        return self._seal_into(self._nonce(), plain, into, ledger_id=ledger_id, object_number=object_number,
                               position=position)

    def _seal_into(self, nonce: bytes, plain: bytes | bytearray | memoryview, into: bytearray | None, *,
                   ledger_id: int, object_number: int, position: int) -> memoryview:
        n = len(plain)
        if into is None or len(into) < n + SEALED_OVERHEAD:
            into = bytearray(n + SEALED_OVERHEAD)
        buf = memoryview(into)[:n + SEALED_OVERHEAD]
        _PART_HEAD.pack_into(buf, 0, SEALED_BLOCK_MAGIC, nonce)
        # one AES-GCM message: ciphertext then tag; OpenSSL runs it without the GIL
        self._aead.encrypt_into(nonce, plain, _PART_AD.pack(SEALED_BLOCK_MAGIC, ledger_id, object_number, position),
                                buf[_PART_HEAD.size:])
        return buf

    def seal_section(self, chunks: Iterable[bytes], *, ledger_id: int, object_number: int,
                     position: int) -> Iterator[bytes]:
        """A section's chunks, sealed as one message, streamed (the plain section is never held whole)."""
        nonce = self._nonce()
        enc = Cipher(algorithms.AES(self._dek), modes.GCM(nonce)).encryptor()
        enc.authenticate_additional_data(_PART_AD.pack(SEALED_SECTION_MAGIC, ledger_id, object_number, position))
        yield _PART_HEAD.pack(SEALED_SECTION_MAGIC, nonce)
        for chunk in chunks:
            out = enc.update(chunk)
            if out:
                yield out
        tail = enc.finalize()
        yield tail + enc.tag

    def seal_index(self, plain: bytes, *, key_base: str) -> bytes:
        """The sealed index object of the plain one (``encode_index``'s bytes), for the copy at ``key_base``."""
        kid = self.key_id.encode()
        head = (_INDEX_HEAD.pack(SEALED_INDEX_MAGIC, SEALED_INDEX_VERSION, len(kid)) + kid
                + _WRAPPED_LEN.pack(len(self._wrapped)) + self._wrapped + self._nonce())
        return head + self._aead.encrypt(head[-NONCE_BYTES:], plain, head + key_base.encode())

    # -- opening -----------------------------------------------------------------------------------------------

    def _open(self, magic: int, data: bytes | bytearray | memoryview, *, key: str, ledger_id: int,
              object_number: int, position: int, what: str, kafka_offset: int | None,
              into: bytearray | None = None) -> bytes | memoryview:
        if len(data) < SEALED_OVERHEAD:
            raise CorruptRemoteObjectError(
                f"truncated encrypted {what}: expected at least {SEALED_OVERHEAD} bytes, found {len(data)}", key=key,
                position=position, kafka_offset=kafka_offset)
        found, nonce = _PART_HEAD.unpack_from(data, 0)
        if found != magic:
            plain = " (a plain, unencrypted part)" if found == BLOCK_MAGIC else ""
            raise CorruptRemoteObjectError(
                f"{what}: bad magic 0x{found:08X}{plain}, expected encrypted 0x{magic:08X}", key=key,
                position=position, kafka_offset=kafka_offset)
        ad = _PART_AD.pack(magic, ledger_id, object_number, position)
        sealed = memoryview(data)[_PART_HEAD.size:]
        out: memoryview | None = None
        try:
            if into is not None and len(into) >= len(sealed) - TAG_BYTES and hasattr(self._aead, "decrypt_into"):
                out = memoryview(into)[:len(sealed) - TAG_BYTES]
                self._aead.decrypt_into(nonce, sealed, ad, out)
                return out
            return self._aead.decrypt(nonce, sealed, ad)
        except InvalidTag:
            if out is not None:
                # decrypt_into wrote the plaintext before the tag failed: a reused buffer must not keep bytes
                # that were never authenticated (a caller ignoring the error would serve them).
                out[:] = bytes(len(out))
            raise CorruptRemoteObjectError(
                f"{what} ({len(data)} bytes) fails authentication under the copy's data key (key id "
                f"{self.key_id!r}): tampered, truncated or moved; its bytes are not returned", key=key,
                position=position, kafka_offset=kafka_offset) from None

    def open_block(self, data: bytes | bytearray | memoryview, *, key: str, ledger_id: int, object_number: int,
                   position: int, part_id: int, kafka_offset: int | None = None,
                   into: bytearray | None = None) -> bytes | memoryview:
        """The plain block of a sealed one read at ``position`` of ``key`` (data object ``object_number``); with
        ``into`` (at least the plain length) decrypted into it, no allocation (a view of it is returned)."""
        return self._open(SEALED_BLOCK_MAGIC, data, key=key, ledger_id=ledger_id, object_number=object_number,
                          position=position, what=f"block {part_id}", kafka_offset=kafka_offset, into=into)

    def open_section(self, data: bytes | bytearray | memoryview, *, key: str, ledger_id: int, object_number: int,
                     position: int, what: str) -> bytes:
        """The plain section of a sealed one read at ``position`` of ``key``."""
        return self._open(SEALED_SECTION_MAGIC, data, key=key, ledger_id=ledger_id, object_number=object_number,
                          position=position, what=what, kafka_offset=None)


class BlockSealer:
    """Seals a copy's blocks one ahead, on a worker thread: :meth:`push` of block *i* starts sealing it and returns
    block *i - 1* sealed (None for the first), :meth:`flush` the last one. AES-GCM runs in OpenSSL without the GIL,
    so sealing block *i* overlaps reading block *i + 1* and writing block *i - 1*: an encrypted copy takes about the
    wall time of a plain one, the cipher's CPU on the other core.

    The plain block pushed must stay unchanged until the push after it returns (the ledger writer's two buffers
    take turns); a sealed block returned is valid until the next push (two output buffers take turns). Placement
    (object number, position) is fixed at push time, and with it the associated data."""

    __slots__ = ("_cipher", "_outs", "_pending", "_turn")

    def __init__(self, cipher: CopyCipher) -> None:
        self._cipher = cipher
        self._outs = [bytearray(), bytearray()]
        self._turn = 0
        self._pending: Future[memoryview] | None = None

    def push(self, plain: bytes | bytearray | memoryview, *, ledger_id: int, object_number: int,
             position: int) -> memoryview | None:
        """Start sealing ``plain``; the previous block pushed, sealed (its error, if sealing it failed)."""
        need = len(plain) + SEALED_OVERHEAD
        if len(self._outs[self._turn]) < need:
            self._outs[self._turn] = bytearray(need)
        fut = worker_pool().submit(self._cipher._seal_into, self._cipher._nonce(), plain, self._outs[self._turn],
                                   ledger_id=ledger_id, object_number=object_number, position=position)
        self._turn ^= 1
        prev, self._pending = self._pending, fut
        return None if prev is None else prev.result()

    def flush(self) -> memoryview | None:
        """The last block pushed, sealed (None when there is none)."""
        prev, self._pending = self._pending, None
        return None if prev is None else prev.result()

    def close(self) -> None:
        """Wait for a block still being sealed (a copy that failed), its result dropped."""
        prev, self._pending = self._pending, None
        if prev is not None:
            futures_wait([prev])


_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def worker_pool() -> ThreadPoolExecutor:
    """The process's threads for work that runs without the GIL: sealing whole blocks (AES-GCM) and reading an
    encrypted copy's next block from the store (a ranged GET streaming, for S3). Reads are I/O, and every reader
    running at once (history endpoint fetches, Spark tasks) has one in flight, so the pool is sized for them, not
    for the cores: 8 threads per core, 8 to 64, started as needed (and anew in a forked child: Spark's Python
    workers fork)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(8, min(64, 8 * (os.cpu_count() or 1))),
                                       thread_name_prefix="rsm-aes")
        return _pool


def _forget_pool_in_child() -> None:
    global _pool, _pool_lock
    _pool = None  # the parent's threads do not exist in the child
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_in_child)


def new_copy_cipher(provider: KeyProvider, key_id: str, *, key_base: str) -> CopyCipher:
    """A fresh random data key for the copy at ``key_base``, wrapped by ``key_id`` through ``provider``."""
    dek = AESGCM.generate_key(bit_length=DEK_BYTES * 8)
    return CopyCipher(dek, key_id, provider.wrap(key_id, dek, key_base.encode()))


def _open_index(data: bytes | memoryview, *, key: str, key_base: str,
                provider: KeyProvider | None) -> tuple[bytes, CopyCipher]:
    buf = memoryview(data)

    def truncated(what: str, need: int, pos: int) -> CorruptRemoteObjectError:
        return CorruptRemoteObjectError(f"truncated encrypted index object {what}: expected {need} bytes, found "
                                        f"{max(0, len(buf) - pos)}", key=key, position=pos)

    if len(buf) < _INDEX_HEAD.size:
        raise truncated("header", _INDEX_HEAD.size, 0)
    _magic, version, kid_len = _INDEX_HEAD.unpack_from(buf, 0)
    if version != SEALED_INDEX_VERSION:
        raise CorruptRemoteObjectError(f"unknown encrypted index object version {version}", key=key, position=4)
    pos = _INDEX_HEAD.size
    if len(buf) < pos + kid_len + _WRAPPED_LEN.size:
        raise truncated("key id", kid_len + _WRAPPED_LEN.size, pos)
    try:
        key_id = bytes(buf[pos:pos + kid_len]).decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptRemoteObjectError("encrypted index object: key id is not utf-8", key=key, position=pos) from None
    pos += kid_len
    (wrapped_len,) = _WRAPPED_LEN.unpack_from(buf, pos)
    pos += _WRAPPED_LEN.size
    if len(buf) < pos + wrapped_len + NONCE_BYTES + TAG_BYTES:
        raise truncated("wrapped data key", wrapped_len + NONCE_BYTES + TAG_BYTES, pos)
    wrapped = bytes(buf[pos:pos + wrapped_len])
    pos += wrapped_len
    nonce = bytes(buf[pos:pos + NONCE_BYTES])
    pos += NONCE_BYTES
    if provider is None or not provider.has_key(key_id):
        why = "no encryption keys are configured" if provider is None else "that key id is not configured"
        raise KeyNotConfiguredError(
            f"{key}: the copy is encrypted under key id {key_id!r} and {why} (store.encryption key_file / key_env "
            "must hold every key id still in use)", key_id=key_id)
    try:
        dek = provider.unwrap(key_id, wrapped, key_base.encode())
    except KeyNotConfiguredError as err:
        raise KeyNotConfiguredError(f"{key}: {err}", key_id=key_id) from None
    except UnwrapError as err:
        raise CorruptRemoteObjectError(f"encrypted index object: {err} (tampered, moved from another key, or a "
                                       "different key under the same id)", key=key, position=_INDEX_HEAD.size) \
            from None
    cipher = CopyCipher(dek, key_id, wrapped)
    try:
        plain = cipher._aead.decrypt(nonce, buf[pos:], bytes(buf[:pos]) + key_base.encode())
    except InvalidTag:
        raise CorruptRemoteObjectError(
            f"encrypted index object ({len(buf)} bytes) fails authentication under its data key (key id "
            f"{key_id!r}): tampered or truncated", key=key, position=pos) from None
    return plain, cipher


def decode_copy_index(data: bytes | memoryview, *, key: str, key_base: str, provider: KeyProvider | None,
                      require_sealed: bool = False) -> IndexObject:
    """Decode a copy's index object, plain or sealed. A sealed one is opened with ``provider`` (its ledgers then
    carry the copy's :class:`CopyCipher`): :class:`KeyNotConfiguredError` names a key id ``provider`` lacks,
    :class:`CorruptRemoteObjectError` names ``key`` for anything tampered or truncated, and, with
    ``require_sealed``, for a plain index object (a plain copy cannot stand in for an encrypted one)."""
    if not is_sealed_index(data):
        if require_sealed:
            raise CorruptRemoteObjectError(
                "the copy is not encrypted and store.encryption.require_encrypted is set (the default once "
                "encryption is enabled): refused unread, as a plain object put in place of an encrypted copy would "
                "be. If this copy was made before encryption was enabled, set store.encryption.require_encrypted: "
                "false until no plain copy is left (rlm verify without that setting names them)", key=key, position=0)
        return decode_index(data, key=key)
    plain, cipher = _open_index(data, key=key, key_base=key_base, provider=provider)
    index = decode_index(plain, key=key)
    return replace(index, ledgers=tuple(replace(ledger, cipher=cipher) for ledger in index.ledgers))
