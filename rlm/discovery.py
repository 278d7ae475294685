"""What the sidecar tiers: partitions found in the broker's log dirs, and what the cluster says about them.

Two sources, merged by the sidecar every discovery interval:

- the broker's ``log.dirs`` (every one of them: JBOD), scanned for ``<topic>-<partition>`` directories. A
  replica being moved between log dirs shows up as ``<topic>-<partition>.<uuid>-future`` until the move ends;
  those, ``-delete`` and ``-stray`` directories are ignored, so a moved replica is simply found in its new dir on
  the next scan;
- the cluster (AdminClient): topic ids, leaders, compacted topics, last stable offsets (ListOffsets with
  read_committed isolation).

Every per-topic answer the sidecar acts on destructively is asked for explicitly, by name, and an error is kept
as an error: a topic the principal may not Describe is omitted from the all-topics listing, a lagging broker
answers UNKNOWN_TOPIC_OR_PART for a live topic, and a failed DescribeConfigs says nothing about the topic's
cleanup policy. :meth:`ClusterView.topic_ids` and :meth:`ClusterView.compaction` return those answers as they
came; deciding what they prove is the caller's (:mod:`rlm.tasks.purge` for deleted topics).

:func:`classify` merges the two: each tiered partition in the log dirs is led here, followed, or skipped this round
(with the reason, :class:`Skip`).
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec

from rlm import metrics
from rlm.topic_ids import TopicIdFiles
from rlmm.api import TopicIdPartition
from rsm.log.errors import LogFormatError

__all__ = ["Classification", "ClusterView", "LocalPartition", "MetadataAnswer", "PartitionInfo", "Skip", "TopicLookup",
           "classify", "partition_key", "scan_log_dirs"]

log = logging.getLogger(__name__)

# the admin calls counted (rlm_cluster_calls), children kept rather than labels() per call
_LIST_OFFSETS = metrics.CLUSTER_CALLS.labels("list_offsets")
_METADATA = metrics.CLUSTER_CALLS.labels("metadata")
_DESCRIBE_TOPICS = metrics.CLUSTER_CALLS.labels("describe_topics")
_DESCRIBE_CONFIGS = metrics.CLUSTER_CALLS.labels("describe_configs")

_PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")


@dataclass(frozen=True, slots=True)
class LocalPartition:
    topic: str
    partition: int
    path: Path


def partition_key(name: str) -> tuple[str, int] | None:
    """``(topic, partition)`` of a partition directory's name (``<topic>-<partition>``); None for anything else
    (checkpoint files, ``-future``, ``-delete`` and ``-stray`` directories)."""
    m = _PARTITION_DIR.match(name)
    return (m["topic"], int(m["partition"])) if m else None


def scan_log_dirs(log_dirs: Iterable[Path]) -> dict[tuple[str, int], LocalPartition]:
    """Every partition directory in the given log dirs, keyed by (topic, partition).

    A partition found in two log dirs at once (should not happen outside a move) keeps the first found and logs it.
    """
    found: dict[tuple[str, int], LocalPartition] = {}
    for log_dir in log_dirs:
        base = Path(log_dir)
        try:  # (scandir: an entry's type without a stat; names sorted as strings, not as Paths: issue 26)
            entries = sorted(os.scandir(base), key=lambda e: e.name)
        except FileNotFoundError:
            log.warning("log dir missing", extra={"log_dir": str(log_dir)})
            continue
        for entry in entries:
            key = partition_key(entry.name)
            if key is None or not entry.is_dir():
                continue  # checkpoints, meta.properties, *-future / *-delete / *-stray directories
            path = base / entry.name
            if key in found:
                log.warning("partition in two log dirs", extra={"partition": f"{key[0]}-{key[1]}",
                                                                "kept": str(found[key].path), "ignored": str(path)})
                continue
            found[key] = LocalPartition(key[0], key[1], path)
    return found


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    topic_id: uuid.UUID
    partition: int
    leader: int
    replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MetadataAnswer:
    """What one Metadata request (all topics) said of some topics (:meth:`ClusterView.metadata`): per topic asked
    (sorted by name), ``(name, None)`` when absent from the answer, else ``(name, error code or None, partitions)``
    with ``partitions`` sorted ``(partition, leader, replicas, error code or None)``; ``fingerprint`` is their hash
    (:meth:`ClusterView.metadata_fingerprint`)."""

    topics: tuple[tuple[object, ...], ...]
    fingerprint: int

    def leadership(self) -> dict[tuple[str, int], tuple[int, tuple[int, ...]]]:
        """Each partition named: ``(leader, replicas)`` (made when asked: a cheap round needs the fingerprint only)."""
        return {(t[0], p[0]): (p[1], p[2]) for t in self.topics if len(t) == 3 for p in t[2]}

    def agrees(self, cluster: Mapping[tuple[str, int], PartitionInfo], topics: Iterable[str]) -> bool:
        """Whether ``cluster`` (:meth:`ClusterView.partitions` of ``topics``, asked after this answer) names the same
        partitions of ``topics``, with the same leaders and replicas. Each broker answers from its own copy of the
        cluster's metadata, which follows the controller's with a lag: the two requests may reach two brokers, the
        first already past a leader election, the second not yet. Then the fingerprint does not describe the
        leaders acted on, and a round reusing that answer while the fingerprint stays equal would keep the old
        leaders for as long (up to ``tasks.rescan_interval_ms``, 60 s by default: a new leader's sidecar not leading
        its partition 30 s after a preferred election, with no error, as CI saw in session 15)."""
        names = set(topics)
        return {k: v for k, v in self.leadership().items() if k[0] in names} == {
            k: (info.leader, info.replicas) for k, info in cluster.items()}


@dataclass(frozen=True, slots=True)
class TopicLookup:
    """One topic name described explicitly: its id, or the error it was answered with (a KafkaError code:
    ``UNKNOWN_TOPIC_OR_PART``, ``TOPIC_AUTHORIZATION_FAILED``, ``_TIMED_OUT``, ...)."""

    topic: str
    topic_id: uuid.UUID | None = None
    error_code: int | None = None
    error: str = ""


_UNREACHABLE = frozenset({KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN})
"""Errors of a call that reached no broker (not the cluster's answer)."""


def _error_code(err: BaseException) -> int | None:
    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        return err.args[0].code()
    return None


def _to_uuid(kafka_uuid: object) -> uuid.UUID:
    msb = kafka_uuid.get_most_significant_bits() & (2**64 - 1)  # type: ignore[attr-defined]
    lsb = kafka_uuid.get_least_significant_bits() & (2**64 - 1)  # type: ignore[attr-defined]
    return uuid.UUID(int=(msb << 64) | lsb)


class Skip(StrEnum):
    """Why a tiered partition in the log dirs is neither led nor followed this round (fail closed: not tiered)."""

    NOT_DESCRIBED = "not described"  # absent from the cluster's answer (deleted, not authorized, not yet known)
    COMPACTED = "compacted"  # cleanup.policy includes compact: never tiered
    CONFIG_UNKNOWN = "config unknown"  # its DescribeConfigs failed or went unanswered this round
    NO_PARTITION_METADATA = "no partition.metadata"  # the broker has not written it yet (or it is unreadable)
    OTHER_TOPIC_ID = "another topic id"  # a directory left over from a deleted topic of the same name


@dataclass(frozen=True, slots=True)
class Classification:
    """One discovery round's answer: the partitions led by this broker (-> their partition dir), the ones followed,
    and the ones skipped with the reason."""

    leaders: dict[TopicIdPartition, Path] = field(default_factory=dict)
    followers: set[TopicIdPartition] = field(default_factory=set)
    skipped: dict[tuple[str, int], Skip] = field(default_factory=dict)


def classify(local: Mapping[tuple[str, int], LocalPartition], cluster: Mapping[tuple[str, int], PartitionInfo],
             compaction: Mapping[str, bool | None], broker_id: int, topic_ids: TopicIdFiles | None = None,
             ) -> Classification:
    """Split the tiered partitions found in the log dirs (``local``, :func:`scan_log_dirs` filtered by the topic
    selection) by the cluster's answer: led by ``broker_id``, or followed. A partition is skipped when the cluster
    did not describe it, its topic is compacted or its compaction unknown (``compaction``:
    :meth:`ClusterView.compaction`; a topic missing from it is unknown), its ``partition.metadata`` cannot be read,
    or its directory holds another topic id than the cluster's (a deleted topic of the same name). Reads only each
    partition dir's ``partition.metadata`` (through ``topic_ids``, the caller's cache of them kept across rounds, when
    given: the files change once per directory); asks the cluster nothing."""
    out = Classification()
    topic_ids = topic_ids if topic_ids is not None else TopicIdFiles()
    for key, lp in local.items():
        info = cluster.get(key)
        compacted = compaction.get(key[0])
        if info is None:
            out.skipped[key] = Skip.NOT_DESCRIBED
            continue
        if compacted is not False:
            out.skipped[key] = Skip.COMPACTED if compacted else Skip.CONFIG_UNKNOWN
            continue
        try:
            local_id = topic_ids.topic_id(lp.path)
        except (FileNotFoundError, NotADirectoryError, LogFormatError):
            out.skipped[key] = Skip.NO_PARTITION_METADATA
            continue
        if local_id != info.topic_id:
            out.skipped[key] = Skip.OTHER_TOPIC_ID
            continue
        tp = TopicIdPartition(info.topic_id, info.topic, info.partition)
        if info.leader == broker_id:
            out.leaders[tp] = lp.path
        else:
            out.followers.add(tp)
    return out


class ClusterView:
    """The cluster's answers the sidecar needs, through one AdminClient."""

    def __init__(self, client_config: dict[str, object], timeout_s: float = 15.0) -> None:
        # librdkafka sends DescribeTopics to the broker it last learned is "the controller" (in KRaft, any
        # broker the cluster names) and keeps that choice until its next metadata refresh (5 min by default):
        # a stopped broker would stall discovery that long. Refresh often, and start over after a timeout.
        self._config = {"topic.metadata.refresh.interval.ms": 10_000, **client_config}
        self._start_afresh()
        self.timeout_s = timeout_s
        self._wait_s = timeout_s + 5.0  # a future never waited on for longer than the request's own timeout + 5 s

    def _start_afresh(self) -> None:
        """The next call bootstraps a new admin client: the last one reached no broker (it may stay unable to)."""
        self._admin = AdminClient(self._config)

    def _drained(self) -> AdminClient:
        """The admin client, its queued log lines handed to our logging first (they queue until a poll)."""
        admin = self._admin
        if admin is None:
            raise RuntimeError("ClusterView is closed")
        admin.poll(0)
        return admin

    def close(self) -> None:
        """Let go of the admin client (librdkafka destroys it: no reconnect attempts to a stopped cluster)."""
        if self._admin is not None:
            self._admin.poll(0)
        self._admin = None  # type: ignore[assignment]

    def partitions(self, topics: Iterable[str] | None = None, *,
                   skip_unauthorized: bool = False) -> dict[tuple[str, int], PartitionInfo]:
        """Leader, replicas and topic id of every partition of ``topics`` (default: all topics).

        A topic that does not exist (any more) is absent from the answer. A topic the principal may not
        Describe fails the call, unless ``skip_unauthorized``: then it is absent too (logged), so one topic's
        revoked ACL does not stop discovery of every other topic. Absence never means "deleted".
        """
        admin = self._drained()  # held until every future is answered (a failure below replaces self._admin)
        names = sorted(topics) if topics is not None else sorted(_list_topics(admin, self.timeout_s).topics)
        if not names:
            return {}
        _DESCRIBE_TOPICS.inc()
        futures = admin.describe_topics(TopicCollection(names), request_timeout=self.timeout_s)
        out: dict[tuple[str, int], PartitionInfo] = {}
        for name, fut in futures.items():
            try:
                desc = fut.result(self._wait_s)
            except KafkaException as err:
                code = _error_code(err)
                if code == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    log.info("topic not described", extra={"topic": name, "error": str(err)})
                    continue  # a topic deleted meanwhile is simply absent
                if code == KafkaError.TOPIC_AUTHORIZATION_FAILED and skip_unauthorized:
                    log.warning("topic not described: not authorized", extra={"topic": name, "error": str(err)})
                    continue
                # The broker is unreachable or timed out: an answer without this topic would read as "deleted"
                # (and purge its remote data) or "not led" (and stop its copies). Fail the whole round instead,
                # with a fresh client for the next one (it bootstraps from a broker that answers).
                self._start_afresh()
                raise
            except TimeoutError:
                self._start_afresh()
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"describe topics: no answer within "
                                                f"{self._wait_s:.0f}s")) from None
            tid = _to_uuid(desc.topic_id)
            for p in desc.partitions:
                leader = p.leader.id if p.leader is not None else -1
                out[(name, p.id)] = PartitionInfo(name, tid, p.id, leader, tuple(r.id for r in p.replicas))
        return out

    def metadata_fingerprint(self, topics: Iterable[str]) -> int:
        """A hash of what one Metadata request (all topics) says of ``topics``: each one's error or partitions, with
        their leaders, replicas and errors (a topic absent from the answer hashes as absent). Equal fingerprints: the
        leadership of these topics did not change between the two requests. Topic ids and configs are not in it (a
        topic re-created under its name shows in the log dirs; configs are read by every full discovery round).
        Raises when no broker answers (it proves the cluster answers, as :meth:`cluster_id`); the next call then
        starts with a fresh client, as :meth:`partitions` does: this is the first call of every discovery round, so
        a client that stays unable to reach a broker which is back (seen after a broker restart, ``_TRANSPORT``
        for minutes) would otherwise fail every round and never be replaced."""
        return self.metadata(topics).fingerprint

    def metadata(self, topics: Iterable[str]) -> MetadataAnswer:
        """One Metadata request (all topics): the :meth:`metadata_fingerprint` of ``topics`` and the leader and
        replicas of each of their partitions it named (what a full discovery round compares with
        :meth:`partitions`' answer: :meth:`MetadataAnswer.agrees`). Raises as :meth:`metadata_fingerprint`."""
        try:
            md = _list_topics(self._drained(), self.timeout_s)
        except KafkaException:
            self._start_afresh()
            raise
        items: list[tuple[object, ...]] = []
        for name in sorted(set(topics)):
            t = md.topics.get(name)
            if t is None:
                items.append((name, None))
                continue
            items.append((name, t.error.code() if t.error is not None else None, tuple(sorted(
                (p.id, p.leader, tuple(p.replicas), p.error.code() if p.error is not None else None)
                for p in t.partitions.values()))))
        answered = tuple(items)
        return MetadataAnswer(answered, hash(answered))

    def topic_ids(self, topics: Iterable[str]) -> dict[str, TopicLookup]:
        """Describe each of ``topics`` explicitly by name; every name gets an answer: its topic id or its error.

        Never raises for one topic's error; a request that could not be sent at all raises. A future left
        unanswered is a ``_TIMED_OUT`` answer (and the next call starts with a fresh client, as
        :meth:`partitions` does).
        """
        names = sorted(set(topics))
        if not names:
            return {}
        admin = self._drained()
        _DESCRIBE_TOPICS.inc()
        futures = admin.describe_topics(TopicCollection(names), request_timeout=self.timeout_s)
        out: dict[str, TopicLookup] = {}
        for name, fut in futures.items():
            try:
                out[name] = TopicLookup(name, topic_id=_to_uuid(fut.result(self._wait_s).topic_id))
            except TimeoutError:
                self._start_afresh()
                out[name] = TopicLookup(name, error_code=KafkaError._TIMED_OUT,
                                        error=f"no answer within {self._wait_s:.0f}s")
            except Exception as err:  # noqa: BLE001 - kept as this topic's answer
                code = _error_code(err)
                if code not in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_AUTHORIZATION_FAILED):
                    self._start_afresh()  # unreachable / timed out: bootstrap afresh
                out[name] = TopicLookup(name, error_code=code, error=str(err))
        for name in names:
            out.setdefault(name, TopicLookup(name, error_code=KafkaError._TIMED_OUT, error="not answered"))
        return out

    def cluster_id(self) -> str:
        """The cluster's id (DescribeCluster)."""
        return str(self._drained().describe_cluster(request_timeout=self.timeout_s).result(self._wait_s).cluster_id)

    def topic_configs(self, topics: Iterable[str]) -> dict[str, dict[str, str | None] | None]:
        """Per topic: its config (DescribeConfigs: name -> value), None when unknown (the call failed or went
        unanswered). Every topic asked for gets an entry."""
        names = sorted(set(topics))
        if not names:
            return {}
        resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in names]
        out: dict[str, dict[str, str | None] | None] = dict.fromkeys(names)
        admin = self._drained()
        _DESCRIBE_CONFIGS.inc()
        for res, fut in admin.describe_configs(resources, request_timeout=self.timeout_s).items():
            try:
                entries = fut.result(self._wait_s)
            except Exception as err:  # noqa: BLE001 - unknown
                log.warning("topic config not described", extra={"topic": res.name, "error": str(err)})
                continue
            out[res.name] = {k: e.value for k, e in entries.items()}
        return out

    def compaction(self, topics: Iterable[str],
                   configs: dict[str, dict[str, str | None] | None] | None = None) -> dict[str, bool | None]:
        """Per topic: True when its ``cleanup.policy`` includes ``compact``, False when it does not, None when
        unknown (its DescribeConfigs failed or went unanswered). Every topic asked for gets an entry. ``configs``:
        what :meth:`topic_configs` answered already."""
        configs = self.topic_configs(topics) if configs is None else configs
        out: dict[str, bool | None] = {}
        for name, entries in configs.items():
            policy = None if entries is None else entries.get("cleanup.policy")
            if entries is not None and policy is None:
                log.warning("topic config without cleanup.policy: its compaction is unknown", extra={"topic": name})
            out[name] = None if policy is None else "compact" in policy
        return out

    def compacted_topics(self, topics: Iterable[str]) -> set[str]:
        """Topics that must not be tiered for their config: ``cleanup.policy`` includes ``compact``, or the
        config could not be read (fail closed: unknown counts as compacted)."""
        return {t for t, compacted in self.compaction(topics).items() if compacted is not False}

    def last_stable_offsets(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """ListOffsets(latest, read_committed) per partition: the LSO, below which no transaction is open."""
        return {k: lso for k, (lso, _epoch) in self.stable_offsets_and_epochs(partitions).items()}

    def stable_offsets_and_epochs(self, partitions: Iterable[tuple[str, int]],
                                  ) -> dict[tuple[str, int], tuple[int, int]]:
        """ListOffsets(latest, read_committed) per partition: (the LSO, the leader epoch of the leader that
        answered, -1 when the answer carries none). A partition without an answer (not led any more, topic gone)
        is left out."""
        request = {TopicPartition(t, p): OffsetSpec.latest() for t, p in partitions}
        if not request:
            return {}
        admin = self._drained()
        _LIST_OFFSETS.inc()
        metrics.LIST_OFFSETS_PARTITIONS.inc(len(request))
        futures = admin.list_offsets(request, isolation_level=IsolationLevel.READ_COMMITTED,
                                     request_timeout=self.timeout_s)
        out: dict[tuple[str, int], tuple[int, int]] = {}
        unreachable = 0
        for tp, fut in futures.items():
            try:
                info = fut.result(self._wait_s)
                epoch = info.leader_epoch  # None (or -1) when the answer carries none
                out[(tp.topic, tp.partition)] = (info.offset, -1 if epoch is None else epoch)
            except Exception as err:  # noqa: BLE001 - not leader any more, topic gone: skip this round
                unreachable += isinstance(err, TimeoutError) or _error_code(err) in _UNREACHABLE
                log.info("no last stable offset", extra={"partition": f"{tp.topic}-{tp.partition}",
                                                         "error": str(err)})
        if unreachable == len(futures):  # no broker reached at all: the next call starts with a fresh client
            self._start_afresh()
        return out


def _list_topics(admin: AdminClient, timeout_s: float):  # noqa: ANN202 - confluent_kafka's ClusterMetadata
    """One Metadata request (all topics), counted."""
    _METADATA.inc()
    return admin.list_topics(timeout=timeout_s)
