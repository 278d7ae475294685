"""The ``kafka-remote`` PySpark data source (``pyspark.sql.datasource``, Spark 4.1+).

``spark.read.format("kafka-remote").option("subscribe", "t1").option(...).load()`` returns the columns of Spark's
Kafka source (``key``, ``value``, ``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType``, and
``headers`` with ``includeHeaders=true``), read from the remote tier: planning in the driver from the metadata
topic (:mod:`rlm.spark.planning`), reading in the executors from the store (:mod:`rlm.spark.executor`), Arrow
batches all the way. Options: :mod:`rlm.spark.options`. ``spark.readStream.format("kafka-remote")`` is the
streaming source of :mod:`rlm.spark.stream`, planned and read the same way.

Filter pushdown (``pushFilters=true`` and ``spark.sql.python.filterPushdown.enabled=true``): comparisons of
``topic`` and ``partition`` (=, IN), ``offset`` (=, <, <=, >, >=, IN) and ``timestamp`` (=, >, >=) prune
partitions, segments and blocks before anything is read. Every filter is still handed back to Spark, which
applies it to the rows: pruning only ever removes rows the filters would remove.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from rlm.kafka_secrets import is_secret_client_property
from rlm.spark.executor import SegmentSlice, read_slice
from rlm.spark.options import SourceOptions, SparkSourceError, parse_options
from rlm.spark.planning import Bounds, plan_slices

__all__ = ["KAFKA_SCHEMA_DDL", "KafkaRemoteDataSource", "register"]

KAFKA_SCHEMA_DDL = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
                    "timestampType int")
HEADERS_DDL = "headers array<struct<key: string, value: binary>>"
# A naive datetime in a pushed filter is in the session time zone, which the planner does not know: widen the
# time bound by the largest UTC offset so that pruning stays conservative.
_MAX_UTC_OFFSET = timedelta(hours=14)


class KafkaRemoteDataSource(DataSource):
    """``format("kafka-remote")``: Kafka records from the remote tier, Spark Kafka source schema."""

    @classmethod
    def name(cls) -> str:
        return "kafka-remote"

    def schema(self) -> str:
        opts = {k.lower(): v for k, v in self.options.items()}
        headers = opts.get("includeheaders", "false").strip().lower() == "true"
        return KAFKA_SCHEMA_DDL + (", " + HEADERS_DDL if headers else "")

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = parse_options(self.options)
        self._forget_secrets()
        return KafkaRemotePushdownReader(opts) if opts.push_filters else KafkaRemoteReader(opts)

    def _forget_secrets(self) -> None:
        """Drop the secret ``kafka.*`` options (``kafka.sasl.password`` ...) once the reader has parsed them: pyspark
        pickles this data source with the reader's read function to every executor, which never talks to Kafka."""
        self.options = {k: v for k, v in self.options.items()
                        if not (k.lower().startswith("kafka.") and is_secret_client_property(k[len("kafka."):]))}

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 - Spark's name
        """``readStream``: :class:`rlm.spark.stream.KafkaRemoteStreamReader` (pyspark 4.2+: admission control)."""
        try:
            from rlm.spark.stream import KafkaRemoteStreamReader
        except ImportError as err:  # pragma: no cover - pyspark 4.1 has no pyspark.sql.streaming.datasource
            raise SparkSourceError(f"readStream.format('kafka-remote') needs pyspark 4.2 or later ({err})") from err
        opts = parse_options(self.options)
        self._forget_secrets()
        return KafkaRemoteStreamReader(opts)


class KafkaRemoteReader(DataSourceReader):
    """Plans one input partition per remote segment (or block range) and reads it as Arrow batches."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.bounds = Bounds()

    def partitions(self) -> Sequence[InputPartition]:
        slices = plan_slices(self.opts, self.bounds)
        return slices if slices else [_EMPTY]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SegmentSlice):
            return iter(())
        return read_slice(partition)

    def __getstate__(self) -> dict[str, Any]:
        """Spark pickles the reader to the executors for :meth:`read`: without the Kafka credentials."""
        return {"opts": self.opts.for_executors(), "bounds": self.bounds}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


class KafkaRemotePushdownReader(KafkaRemoteReader):
    """:class:`KafkaRemoteReader` that also uses pushed-down filters to prune (all filters go back to Spark)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:  # noqa: N802 - Spark's name
        for f in filters:
            _apply(self.bounds, f)
            yield f


_EMPTY = InputPartition(None)


def _ms(value: Any, *, lower: bool) -> int | None:
    if not isinstance(value, datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.now().astimezone().tzinfo)
        value = value - _MAX_UTC_OFFSET if lower else value + _MAX_UTC_OFFSET
    return math.floor(value.timestamp() * 1000)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _apply(b: Bounds, f: Filter) -> None:
    col = getattr(f, "attribute", None)
    if col is None or len(col) != 1:
        return
    name = col[0].lower()
    if name == "topic":
        if isinstance(f, EqualTo) and isinstance(f.value, str):
            b.narrow_topics([f.value])
        elif isinstance(f, In) and all(isinstance(v, str) for v in f.value):
            b.narrow_topics(f.value)
    elif name == "partition":
        if isinstance(f, EqualTo) and _int(f.value) is not None:
            b.narrow_partitions([f.value])
        elif isinstance(f, In) and all(_int(v) is not None for v in f.value):
            b.narrow_partitions(f.value)
    elif name == "offset":
        if isinstance(f, In):
            vals = [_int(v) for v in f.value]
            if vals and all(v is not None for v in vals):
                b.raise_offset_min(min(vals))  # type: ignore[type-var]
                b.lower_offset_max(max(vals))  # type: ignore[type-var]
            return
        v = _int(getattr(f, "value", None))
        if v is None:
            return
        if isinstance(f, EqualTo):
            b.raise_offset_min(v)
            b.lower_offset_max(v)
        elif isinstance(f, GreaterThan):
            b.raise_offset_min(v + 1)
        elif isinstance(f, GreaterThanOrEqual):
            b.raise_offset_min(v)
        elif isinstance(f, LessThan):
            b.lower_offset_max(v - 1)
        elif isinstance(f, LessThanOrEqual):
            b.lower_offset_max(v)
    elif name == "timestamp" and isinstance(f, EqualTo | GreaterThan | GreaterThanOrEqual):
        ms = _ms(f.value, lower=True)
        if ms is not None:
            b.raise_timestamp_min(ms)


def register(spark: SparkSession) -> None:
    """Register the ``kafka-remote`` format with a session (``spark.dataSource.register``)."""
    spark.dataSource.register(KafkaRemoteDataSource)
