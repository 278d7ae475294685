"""Encryption at rest: its configuration and the key-encryption keys (KEKs) behind a :class:`KeyProvider`.

Envelope encryption (the byte formats are in :mod:`rsm.format.crypto`): every copy gets its own random data key
(DEK); the DEK encrypts the copy's objects and is stored in the copy's index object *wrapped* by a KEK named by a
key id. A :class:`KeyProvider` wraps and unwraps DEKs by key id; KEK material never leaves it. Here the KEKs come
from a key file and/or an environment variable (:class:`StaticKeyProvider`); a KMS fits behind the same interface
(``wrap`` = KMS Encrypt of the DEK with ``context`` as its encryption context, ``unwrap`` = KMS Decrypt).

Rotation: add a key id to the key file, make it ``active_key_id``: new copies use it, copies written under an older
key id stay readable as long as that key id is still in the file. A copy whose key id is no longer configured fails
with :class:`KeyNotConfiguredError` naming the key id.

Key file / environment variable format: one JSON object, key id -> base64 (standard alphabet) of 32 random
bytes (an AES-256 key), e.g. made with ``head -c 32 /dev/urandom | base64``::

    {"2026-11": "3q2+7w0k...=", "2027-01": "..."}

Key ids: 1 to 64 characters of ``A-Z a-z 0-9 . _ : / -``, starting with a letter or digit.

Key material is never in a repr, a log line, an error message, a pickled object or a Spark plan: the configuration
holds only where the keys are (a path, a variable name), and each process (a Spark executor too) reads them itself.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import re
import stat
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from rsm.errors import RemoteStorageError, StoreConfigError

__all__ = [
    "KEK_BYTES",
    "EncryptionConfig",
    "KeyNotConfiguredError",
    "KeyProvider",
    "StaticKeyProvider",
    "UnwrapError",
    "load_keys",
]

KEK_BYTES = 32  # AES-256
NONCE_BYTES = 12
_KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}$")
_WRAP_CONTEXT = b"rlm-dek/1"

log = logging.getLogger(__name__)


class KeyNotConfiguredError(RemoteStorageError):
    """A copy is encrypted under a key id this process has no key for (not in the key file / environment, or no
    keys configured at all). Add the key id's key back to the key file (keys stay needed as long as copies written
    under them are kept), or delete the copies."""

    def __init__(self, message: str, *, key_id: str) -> None:
        super().__init__(message)
        self.key_id = key_id


class UnwrapError(Exception):
    """A wrapped data key does not authenticate under its key id's KEK (tampered, or another key of that id)."""


class KeyProvider(ABC):
    """Wraps and unwraps data keys with key-encryption keys named by key ids. Implementations must keep KEK material
    out of ``repr`` and refuse pickling; they are thread-safe."""

    @abstractmethod
    def has_key(self, key_id: str) -> bool:
        """Whether ``key_id`` can wrap and unwrap here."""

    @abstractmethod
    def wrap(self, key_id: str, dek: bytes, context: bytes) -> bytes:
        """``dek`` wrapped by ``key_id``'s KEK, authenticated together with ``context`` (it names the copy)."""

    @abstractmethod
    def unwrap(self, key_id: str, wrapped: bytes, context: bytes) -> bytes:
        """The data key :meth:`wrap` wrapped; :class:`KeyNotConfiguredError` for an unknown key id,
        :class:`UnwrapError` when ``wrapped`` or ``context`` is not what was wrapped."""

    def __reduce__(self):  # noqa: D105
        raise TypeError(f"{type(self).__name__} holds key material and is not pickled: build it from the "
                        "configuration in each process")


class StaticKeyProvider(KeyProvider):
    """KEKs held in memory (from a key file / environment variable: :func:`load_keys`); wraps with AES-256-GCM.

    Wrapped data key => nonce (12 bytes, random) || AES-256-GCM(KEK, DEK) || tag (16 bytes); associated data:
    ``b"rlm-dek/1" || len(key_id) as one byte || key_id || context``.
    """

    __slots__ = ("_keys",)

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        for key_id, material in keys.items():
            if not _KEY_ID.match(key_id):
                raise StoreConfigError(f"encryption key id {key_id!r}: must be 1-64 characters of A-Z a-z 0-9 . _ : "
                                       "/ -, starting with a letter or digit")
            if len(material) != KEK_BYTES:
                raise StoreConfigError(f"encryption key {key_id!r}: {len(material)} bytes, expected {KEK_BYTES}")
        self._keys = {k: AESGCM(bytes(v)) for k, v in keys.items()}

    def __repr__(self) -> str:
        return f"StaticKeyProvider(key_ids={sorted(self._keys)!r})"

    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    def has_key(self, key_id: str) -> bool:
        return key_id in self._keys

    def _aead(self, key_id: str) -> AESGCM:
        aead = self._keys.get(key_id)
        if aead is None:
            raise KeyNotConfiguredError(f"encryption key id {key_id!r} is not configured", key_id=key_id)
        return aead

    @staticmethod
    def _ad(key_id: str, context: bytes) -> bytes:
        kid = key_id.encode()
        return _WRAP_CONTEXT + bytes([len(kid)]) + kid + context

    def wrap(self, key_id: str, dek: bytes, context: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead(key_id).encrypt(nonce, dek, self._ad(key_id, context))

    def unwrap(self, key_id: str, wrapped: bytes, context: bytes) -> bytes:
        aead = self._aead(key_id)
        if len(wrapped) <= NONCE_BYTES:
            raise UnwrapError(f"wrapped data key of {len(wrapped)} bytes is too short")
        try:
            return aead.decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], self._ad(key_id, context))
        except InvalidTag:
            raise UnwrapError(f"the wrapped data key does not authenticate under key id {key_id!r}") from None


def _parse_keys(text: str, source: str) -> dict[str, bytes]:
    """Key id -> key bytes from the JSON of a key file / variable (``source`` names it). Errors never quote it."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        where = f" (line {err.lineno}, column {err.colno})" if isinstance(err, json.JSONDecodeError) else ""
        raise StoreConfigError(f"{source}: not a JSON object of key id -> base64 key{where}") from None
    if not isinstance(raw, dict) or not raw:
        raise StoreConfigError(f"{source}: expected a non-empty JSON object of key id -> base64 key")
    out = {}
    for key_id, value in raw.items():
        if not isinstance(value, str):
            raise StoreConfigError(f"{source}: key {key_id!r}: expected a base64 string")
        try:
            material = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise StoreConfigError(f"{source}: key {key_id!r} is not valid base64") from None
        if len(material) != KEK_BYTES:
            raise StoreConfigError(f"{source}: key {key_id!r} is {len(material)} bytes, expected {KEK_BYTES} "
                                   "(AES-256; e.g. head -c 32 /dev/urandom | base64)")
        out[key_id] = material
    return out


def load_keys(key_file: Path | None, key_env: str | None) -> dict[str, bytes]:
    """The keys of ``key_file`` and of the environment variable ``key_env`` (merged; a key id in both must have the
    same key). :class:`StoreConfigError` names the file or variable, never the key material."""
    keys: dict[str, bytes] = {}
    sources: list[tuple[str, str]] = []
    if key_file is not None:
        try:
            sources.append((f"encryption key file {key_file}", Path(key_file).read_text()))
            mode = Path(key_file).stat().st_mode
        except OSError as err:
            raise StoreConfigError(f"encryption key file {key_file}: cannot read: {err.strerror}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("encryption key file %s is accessible to group or others (mode %03o): make it readable by "
                        "the sidecar's user only (chmod 600)", key_file, stat.S_IMODE(mode))
    if key_env is not None:
        text = os.environ.get(key_env)
        if text is None:
            raise StoreConfigError(f"encryption key variable {key_env} is not set in the environment")
        sources.append((f"encryption key variable {key_env}", text))
    for source, text in sources:
        for key_id, material in _parse_keys(text, source).items():
            if keys.get(key_id, material) != material:
                raise StoreConfigError(f"{source}: key {key_id!r} differs from the same key id elsewhere")
            keys[key_id] = material
    return keys


class EncryptionConfig(BaseModel):
    """The ``encryption`` section of the store configuration (``store.encryption`` in the sidecar's YAML).

    Holds where the keys are, never the keys. Keys are read whenever ``key_file`` or ``key_env`` is set, so copies
    encrypted earlier stay readable with ``enabled: false``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(False, description="encrypt new copies (AES-256-GCM under a data key per copy)")
    active_key_id: str | None = Field(None, description="key id that wraps the data keys of new copies")
    key_file: Path | None = Field(None, description="JSON file: key id -> base64 of a 32-byte key")
    key_env: str | None = Field(None, description="name of an environment variable holding the same JSON")
    require_encrypted: bool = Field(
        None, validate_default=True, description=(  # None: follows enabled (_require_when_enabled)
            "refuse to read plain copies: a plain object put in place of an encrypted copy is an error, never read. "
            "Default: true when enabled is, else false. Migration: set false explicitly while copies made before "
            "encryption was enabled remain (each is refused, naming it, otherwise)"))

    @field_validator("active_key_id")
    @classmethod
    def _key_id(cls, v: str | None) -> str | None:
        if v is not None and not _KEY_ID.match(v):
            raise ValueError("a key id is 1-64 characters of A-Z a-z 0-9 . _ : / -, starting with a letter or digit")
        return v

    @field_validator("require_encrypted", mode="before")
    @classmethod
    def _require_when_enabled(cls, v: bool | None, info: ValidationInfo) -> bool:
        """Unset, ``require_encrypted`` follows ``enabled`` (validated before it): whoever may write to the store
        cannot swap a plain copy in for an encrypted one unless the operator allowed plain copies."""
        return bool(info.data.get("enabled", False)) if v is None else v

    @field_validator("key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError("the name of an environment variable (letters, digits, _), not its value")
        return v

    @model_validator(mode="after")
    def _complete(self) -> EncryptionConfig:
        if self.enabled and self.active_key_id is None:
            raise ValueError("enabled needs active_key_id")
        if self.enabled and self.key_file is None and self.key_env is None:
            raise ValueError("enabled needs key_file or key_env")
        return self

    def key_provider(self) -> StaticKeyProvider | None:
        """The keys (read now), or None when no key source is configured. When ``enabled``, ``active_key_id`` must
        be among them (:class:`StoreConfigError` otherwise)."""
        if self.key_file is None and self.key_env is None:
            return None
        provider = StaticKeyProvider(load_keys(self.key_file, self.key_env))
        if self.enabled and not provider.has_key(self.active_key_id or ""):
            raise StoreConfigError(f"encryption active_key_id {self.active_key_id!r} is not among the configured "
                                   f"keys {provider.key_ids()}")
        return provider
