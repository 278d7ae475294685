"""Which topics the history endpoint serves: the cluster's tiered topics, refreshed in the background.

A topic is served when the sidecar's topic selection tiers it (``topics.include``/``exclude``) and it is not
compacted (compacted topics are never tiered). Its partitions and topic id are the cluster's. The metadata manager
of the endpoint follows every served partition. A failed refresh keeps the last answer (a broker that is down does
not make history disappear) and is logged; so does a topic whose config could not be read this time (its
DescribeConfigs unanswered, or refused: a lost DESCRIBE_CONFIGS ACL): a topic served before stays served, as it was,
until its config is known again (dropping it would answer its history OFFSET_OUT_OF_RANGE, sending a consumer group
back to ``auto.offset.reset``, and stop following its metadata on an ambiguous signal); one not served before is
not served yet. A served topic the cluster's listing leaves out (DescribeTopics answered UNKNOWN_TOPIC_OR_PARTITION,
as a broker still loading the cluster's metadata after a restart may; or the sidecar's principal lost DESCRIBE on it)
stays served as it was for :data:`ABSENT_GRACE_S` from the first refresh that missed it, then is dropped (a topic
deleted for real: the broker answers its Fetches UNKNOWN_TOPIC_ID, never OFFSET_OUT_OF_RANGE, so keeping it a minute
serves nothing the broker would not). Listed again (or created again: another topic id) it is served as listed.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from rlm.discovery import ClusterView
from rlm.logs import limited_logger
from rlmm.api import RemoteLogMetadataManager, TopicIdPartition

__all__ = ["Catalog", "ServedTopic"]

log = limited_logger(__name__)

ABSENT_GRACE_S = 60.0  # a served topic the listing leaves out stays served this long, then is dropped


@dataclass(frozen=True, slots=True)
class ServedTopic:
    name: str
    topic_id: uuid.UUID
    partitions: tuple[int, ...]

    def tp(self, partition: int) -> TopicIdPartition:
        return TopicIdPartition(self.topic_id, self.name, partition)


class Catalog:
    def __init__(self, view: ClusterView, rlmm: RemoteLogMetadataManager, tiered: Callable[[str], bool], *,
                 interval_s: float = 10.0, absent_grace_s: float = ABSENT_GRACE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.view = view
        self.rlmm = rlmm
        self.tiered = tiered
        self.interval_s = interval_s
        self.absent_grace_s = absent_grace_s
        self.clock = clock
        self._absent_since: dict[str, float] = {}  # served topics the listing left out: since when
        self._topics: dict[str, ServedTopic] = {}
        self._by_id: dict[uuid.UUID, ServedTopic] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlm-history-catalog", daemon=True)
        self.refreshed = threading.Event()

    def start(self) -> Catalog:
        self.refresh()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def topics(self) -> dict[str, ServedTopic]:
        return self._topics

    def by_name(self, name: str) -> ServedTopic | None:
        return self._topics.get(name)

    def by_id(self, topic_id: uuid.UUID) -> ServedTopic | None:
        return self._by_id.get(topic_id)

    def refresh(self) -> bool:
        """Describe the cluster's topics once; returns whether it succeeded."""
        try:
            infos = self.view.partitions(None, skip_unauthorized=True)
            names = sorted({name for name, _ in infos if self.tiered(name)})
            compaction = self.view.compaction(names) if names else {}
        except Exception as err:  # noqa: BLE001 - keep the last answer
            log.warning("history endpoint: topic refresh failed", extra={"error": str(err)})
            return False
        parts: dict[str, list[int]] = {}
        ids: dict[str, uuid.UUID] = {}
        for (name, partition), info in infos.items():
            ids[name] = info.topic_id
            if name in names and compaction.get(name) is False:
                parts.setdefault(name, []).append(partition)
        topics = {n: ServedTopic(n, ids[n], tuple(sorted(p))) for n, p in parts.items()}
        for name in names:  # config unknown this time: as it was (the same topic id: not one created again)
            last = self._topics.get(name)
            if compaction.get(name) is None and last is not None and ids.get(name) == last.topic_id:
                topics[name] = last
        now = self.clock()
        for name, last in self._topics.items():  # left out of the listing: as it was, for a while
            if name in ids:
                continue
            since = self._absent_since.get(name)
            if since is None:
                since = self._absent_since[name] = now
                log.warning("history endpoint: a served topic is not in the cluster's listing (deleted, not yet known "
                            "to the broker asked, or not describable by the sidecar's principal): served as it was "
                            "until it has been missing this long", extra={"topic": name,
                                                                          "grace_s": self.absent_grace_s})
            if now - since < self.absent_grace_s:
                topics[name] = last
            else:
                log.warning("history endpoint: a served topic missing from the cluster's listing for its grace is "
                            "no longer served", extra={"topic": name, "grace_s": self.absent_grace_s})
        self._absent_since = {n: t for n, t in self._absent_since.items() if n in topics and n not in ids}
        new = [t.tp(p) for t in topics.values() for p in t.partitions]
        old = {t.tp(p) for t in self._topics.values() for p in t.partitions}
        if set(new) - old:
            self.rlmm.on_partition_leadership_changes([], new)
        gone = old - set(new)
        if gone:
            self.rlmm.on_stop_partitions(list(gone))
        self._topics = topics
        self._by_id = {t.topic_id: t for t in topics.values()}
        self.refreshed.set()
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.refresh()
