"""The ``kafka-remote`` source's options, after Spark's Kafka source where they make sense.

Spark passes options as strings, case-insensitively (keys are compared lower-cased here). Topics:

- ``subscribe``: ``t1,t2``; ``subscribePattern``: a regex (full match); ``assign``: ``{"t1": [0, 1]}``
  (exactly one of the three);
- ``startingOffsets``: ``earliest`` (default), ``latest`` or ``{"t1": {"0": 23, "1": -2}}`` (-2 earliest,
  -1 latest); ``endingOffsets``: ``latest`` (default) or JSON (exclusive, -1 latest). Earliest/latest are those
  of the remote tier: the first remote offset and the one after the last tiered offset;
- ``startingTimestamp`` (ms, every partition) or ``startingOffsetsByTimestamp`` (``{"t1": {"0": ms}}``): start at
  the first record whose timestamp is >= that (ListOffsets semantics); a partition without one reads nothing;
- ``isolation.level`` (or ``kafka.isolation.level``): ``read_uncommitted`` (default) or ``read_committed``;
- ``includeHeaders``: ``false`` (default) / ``true``, adding the ``headers`` column as Spark does;
- ``failOnDataLoss``: ``true`` (default) fails a query whose starting offset is below the earliest remote offset
  (removed by remote retention); ``false`` starts at the earliest remote offset instead;
- ``maxPartitionBytes``: segments larger than this are split into block ranges (default 128 MiB);
- streaming only (``readStream``, :mod:`rlm.spark.stream`): ``maxOffsetsPerTrigger`` (offsets per micro-batch,
  spread over the partitions by their backlog, as Spark's Kafka source), ``minOffsetsPerTrigger`` (a micro-batch
  waits until that many offsets are tiered...) and ``maxTriggerDelay`` (...or that long has passed since the last
  one: ``15m`` by default, a number with ``ms``, ``s``, ``m`` or ``h``). ``endingOffsets`` is refused;
- ``pushFilters``: ``true`` to push filters on topic, partition, offset and timestamp into planning; needs
  ``spark.sql.python.filterPushdown.enabled=true`` as well (Spark refuses a reader with pushdown otherwise).

Where the remote tier is: either ``config`` (path of a sidecar YAML: its ``kafka``, ``metadata`` and ``store``
sections are used), or ``kafka.bootstrap.servers`` (+ any ``kafka.<librdkafka property>`` such as
``kafka.security.protocol``), ``metadata.topic`` (default ``__remote_log_metadata``) and ``store`` (``fs`` |
``s3``) with ``store.<field>`` for each :class:`rsm.manager.RsmConfig` field (``store.root_path``,
``store.bucket``, ``store.endpoint_url``, ``store.region``, ``store.key_prefix`` ...). Optionally
``metadata.cacheDir``: a directory kept between queries for the driver's metadata cache (default: a temporary
one per query).

Secrets (``kafka.sasl.password``, ``kafka.ssl.key.password`` ...): Spark does not print a Python data source's
options in its plans (``df.explain()``, ``queryExecution``: ``BatchScan kafka-remote``), and the parsed options'
repr masks them (:class:`rlm.kafka_secrets.RedactedConfig`). With ``config`` (a sidecar YAML) the password stays
in that file, or in the environment (``RLM_KAFKA__CLIENT``) of the driver.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlm.config import ConfigError, load_settings
from rlm.errors import RlmError
from rlm.kafka_secrets import RedactedConfig
from rlm.tier import Isolation
from rsm.manager import RsmConfig

__all__ = ["EARLIEST", "LATEST", "OffsetSpec", "SourceOptions", "SparkSourceError", "parse_options"]

EARLIEST = -2
LATEST = -1
MiB = 1024 * 1024
DEFAULT_MAX_PARTITION_BYTES = 128 * MiB
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}

_NAMES = {n.lower(): n for n in (
    "subscribe", "subscribePattern", "assign", "startingOffsets", "endingOffsets", "startingTimestamp",
    "startingOffsetsByTimestamp", "includeHeaders", "maxPartitionBytes", "pushFilters", "failOnDataLoss",
    "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")}


def _name(key: str) -> str:
    """An option's name as documented (Spark hands them over lower-cased)."""
    return _NAMES.get(key, key)


class SparkSourceError(RlmError, ValueError):
    """An option of the ``kafka-remote`` source is missing or invalid; the message names the option."""


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """``earliest``/``latest`` for every partition, or per (topic, partition) offsets (EARLIEST/LATEST allowed)."""

    default: int
    per_partition: Mapping[tuple[str, int], int] = field(default_factory=dict)

    def for_partition(self, topic: str, partition: int) -> int | None:
        """The offset for one partition: None when the JSON form does not name it (Spark then fails)."""
        if not self.per_partition:
            return self.default
        return self.per_partition.get((topic, partition))


@dataclass(frozen=True, slots=True)
class SourceOptions:
    subscribe: tuple[str, ...] | None
    subscribe_pattern: str | None
    assign: Mapping[str, tuple[int, ...]] | None
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp_ms: int | None
    starting_by_timestamp: Mapping[tuple[str, int], int] | None
    isolation: Isolation
    include_headers: bool
    max_partition_bytes: int
    push_filters: bool
    fail_on_data_loss: bool
    client_config: Mapping[str, Any]  # a RedactedConfig: its repr masks sasl.password and the like
    metadata_topic: str
    metadata_cache_dir: str | None
    store: Mapping[str, Any]  # RsmConfig as JSON-able values: what executors rebuild their storage manager from
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    ending_given: bool = False

    def rsm_config(self) -> RsmConfig:
        return RsmConfig(**self.store)

    def for_executors(self) -> SourceOptions:
        """These options without the Kafka client configuration (SASL passwords, TLS key passwords ...): what a
        reader pickled to the executors keeps. Executors read the store only (each input partition carries the
        store's config); they never talk to Kafka."""
        return replace(self, client_config={})


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    v = opts.get(key)
    if v is None:
        return default
    if v.strip().lower() in ("true", "1", "yes"):
        return True
    if v.strip().lower() in ("false", "0", "no"):
        return False
    raise SparkSourceError(f"option {_name(key)}: expected true or false, found {v!r}")


def _json(opts: Mapping[str, str], key: str) -> Any:
    try:
        return json.loads(opts[key])
    except json.JSONDecodeError as err:
        raise SparkSourceError(f"option {_name(key)}: not valid JSON at character {err.pos}: {err.msg}") from None


def _positive(opts: Mapping[str, str], key: str) -> int | None:
    if key not in opts:
        return None
    try:
        v = int(opts[key])
    except ValueError:
        raise SparkSourceError(f"option {_name(key)}: not a number: {opts[key]!r}") from None
    if v < 1:
        raise SparkSourceError(f"option {_name(key)}: must be positive, found {v}")
    return v


def _duration_ms(opts: Mapping[str, str], key: str, default: int) -> int:
    raw = opts.get(key)
    if raw is None:
        return default
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", raw.lower())
    if m is None or (m.group(2) and m.group(2) not in _DURATION_MS):
        raise SparkSourceError(f"option {_name(key)}: expected a duration such as 500ms, 30s, 15m or 1h, found "
                               f"{raw!r}")
    return int(m.group(1)) * _DURATION_MS[m.group(2) or "ms"]


def _offsets(opts: Mapping[str, str], key: str, default: int, allowed: tuple[str, ...]) -> OffsetSpec:
    raw = opts.get(key)
    if raw is None:
        return OffsetSpec(default)
    word = raw.strip().lower()
    if word in allowed:
        return OffsetSpec(EARLIEST if word == "earliest" else LATEST)
    value = _json(opts, key)
    if not isinstance(value, dict):
        raise SparkSourceError(f"option {_name(key)}: expected {' or '.join(allowed)} or a JSON object "
                               f'{{"topic": {{"partition": offset}}}}, found {raw!r}')
    out: dict[tuple[str, int], int] = {}
    for topic, parts in value.items():
        if not isinstance(parts, dict):
            raise SparkSourceError(f"option {_name(key)}: topic {topic!r} must map partitions to offsets")
        for p, off in parts.items():
            try:
                pi = int(p)
            except ValueError:
                raise SparkSourceError(f"option {_name(key)}: topic {topic!r}: partition {p!r} is not a number"
                                       ) from None
            if not isinstance(off, int) or isinstance(off, bool) or off < EARLIEST:
                raise SparkSourceError(f"option {_name(key)}: {topic}-{pi}: offset {off!r} is not an offset, -1 "
                                       "or -2")
            out[(topic, pi)] = off
    return OffsetSpec(default, out)


def parse_options(raw: Mapping[str, str]) -> SourceOptions:
    """Validate the options Spark passed (see the module docstring); raise :class:`SparkSourceError`."""
    opts = {k.lower(): v for k, v in raw.items()}
    # -- topics
    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    if len(chosen) != 1:
        raise SparkSourceError("exactly one of the options subscribe, subscribePattern, assign is needed, found "
                               f"{chosen or 'none'}")
    subscribe = pattern = assign = None
    if "subscribe" in opts:
        subscribe = tuple(t.strip() for t in opts["subscribe"].split(",") if t.strip())
        if not subscribe:
            raise SparkSourceError("option subscribe: no topic named")
    elif "subscribepattern" in opts:
        pattern = opts["subscribepattern"]
        try:
            re.compile(pattern)
        except re.error as err:
            raise SparkSourceError(f"option subscribePattern: not a regular expression: {err}") from None
    else:
        value = _json(opts, "assign")
        if not isinstance(value, dict) or not all(
                isinstance(v, list) and all(isinstance(p, int) for p in v) for v in value.values()):
            raise SparkSourceError('option assign: expected JSON like {"topic": [0, 1]}')
        assign = {t: tuple(ps) for t, ps in value.items()}
    # -- ranges
    starting = _offsets(opts, "startingoffsets", EARLIEST, ("earliest", "latest"))
    ending = _offsets(opts, "endingoffsets", LATEST, ("latest",))
    if any(v == EARLIEST for v in ending.per_partition.values()):
        raise SparkSourceError("option endingOffsets: -2 (earliest) is not allowed as an ending offset")
    start_ts = None
    if "startingtimestamp" in opts:
        try:
            start_ts = int(opts["startingtimestamp"])
        except ValueError:
            raise SparkSourceError(f"option startingTimestamp: not a number of ms: {opts['startingtimestamp']!r}"
                                   ) from None
    by_ts = None
    if "startingoffsetsbytimestamp" in opts:
        spec = _offsets(opts, "startingoffsetsbytimestamp", EARLIEST, ())
        by_ts = dict(spec.per_partition)
    if start_ts is not None and by_ts is not None:
        raise SparkSourceError("options startingTimestamp and startingOffsetsByTimestamp exclude each other")
    iso = (opts.get("isolation.level") or opts.get("kafka.isolation.level") or "read_uncommitted").strip().lower()
    if iso not in tuple(Isolation):
        raise SparkSourceError(f"option isolation.level: expected read_uncommitted or read_committed, found {iso!r}")
    try:
        max_bytes = int(opts.get("maxpartitionbytes", DEFAULT_MAX_PARTITION_BYTES))
    except ValueError:
        raise SparkSourceError(f"option maxPartitionBytes: not a number: {opts['maxpartitionbytes']!r}") from None
    if max_bytes < 1:
        raise SparkSourceError(f"option maxPartitionBytes: must be positive, found {max_bytes}")
    # -- where the remote tier is
    client, md_topic, store = _location(opts)
    return SourceOptions(
        subscribe=subscribe, subscribe_pattern=pattern, assign=assign, starting=starting, ending=ending,
        starting_timestamp_ms=start_ts, starting_by_timestamp=by_ts, isolation=Isolation(iso),
        include_headers=_bool(opts, "includeheaders", False), max_partition_bytes=max_bytes,
        push_filters=_bool(opts, "pushfilters", False), fail_on_data_loss=_bool(opts, "failondataloss", True),
        client_config=client, metadata_topic=md_topic,
        metadata_cache_dir=opts.get("metadata.cachedir"), store=store,
        max_offsets_per_trigger=_positive(opts, "maxoffsetspertrigger"),
        min_offsets_per_trigger=_positive(opts, "minoffsetspertrigger"),
        max_trigger_delay_ms=_duration_ms(opts, "maxtriggerdelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
        ending_given="endingoffsets" in opts,
    )


_OWN_KAFKA_KEYS = {"kafka.isolation.level", "kafka.group.id", "kafka.enable.auto.commit"}


def _location(opts: Mapping[str, str]) -> tuple[dict[str, Any], str, dict[str, Any]]:
    if "config" in opts:
        try:
            settings = load_settings(Path(opts["config"]))
        except ConfigError as err:
            raise SparkSourceError(f"option config: {err}") from None
        client = settings.kafka.client_config()
        md_topic = settings.metadata.topic
        store = settings.store.model_dump(mode="json")
    else:
        if "kafka.bootstrap.servers" not in opts:
            raise SparkSourceError("option kafka.bootstrap.servers (or config, a sidecar YAML) is needed to read "
                                   "the metadata topic")
        client = RedactedConfig({k[len("kafka."):]: v for k, v in opts.items()
                                 if k.startswith("kafka.") and k not in _OWN_KAFKA_KEYS})
        md_topic = opts.get("metadata.topic", "__remote_log_metadata")
        fields = {k[len("store."):]: v for k, v in opts.items() if k.startswith("store.")}
        if "store" in opts:
            fields["store"] = opts["store"]
        try:
            store = RsmConfig(**fields).model_dump(mode="json")
        except ValidationError as err:
            bad = "; ".join(f"store.{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in err.errors())
            raise SparkSourceError(f"store options invalid: {bad}") from None
    if "metadata.topic" in opts:
        md_topic = opts["metadata.topic"]
    return client, md_topic, store
