"""The cleaner subscribes to its to-be-deleted topic once the broker lists it (:mod:`rlm.tasks.cleaner`), real broker.

The sidecar creates the topic right before the cleaner starts; Kafka's CreateTopics answers once the controller has
it, and the broker lists it in Metadata only once it has applied it, behind whatever large change came first (here a
topic of 50 partitions, as the metadata topic's default or ``__consumer_offsets`` on a new cluster). Subscribed in
that gap, librdkafka told the cleaner ``UNKNOWN_TOPIC_OR_PART``, logged as a warning at every sidecar start.
"""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka.admin import AdminClient, NewTopic

from devtools.devkafka import KafkaCluster
from rlm.tasks.cleaner import Cleaner
from rlm.tasks.deleter import SegmentDeleter, ensure_topic
from tests.support.kafka import produce
from tests.support.sidecar import wait_for


def _errors(consumer: Consumer, seconds: float) -> list[int]:
    """The error codes ``consumer`` is told within ``seconds``."""
    codes = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is not None:
            codes.append(msg.error().code())
    return codes


def test_a_cleaner_started_as_its_topic_is_created_tells_no_consumer_error(
        kafka: KafkaCluster, caplog: pytest.LogCaptureFixture) -> None:
    """Next to the cleaner, a consumer of the same settings subscribed at once, as the cleaner did before: it is told
    the topic is unknown (the gap; the first consumer a process creates may come too late for it, hence up to three
    tries), the cleaner is told nothing and reads the topic's record."""
    caplog.set_level(logging.WARNING, logger="rlm.tasks.cleaner")
    admin = AdminClient(kafka.admin_config())
    created: list[str] = []
    cleaner = None
    try:
        for _ in range(3):
            tag = uuid.uuid4().hex[:8]
            big, topic = f"big-{tag}", f"tbd-{tag}"
            created += [big, topic]
            admin.create_topics([NewTopic(big, 50, 1)])[big].result(30)  # the broker applies it meanwhile
            ensure_topic(kafka.client_config(), topic, partitions=1, replication_factor=1)
            if cleaner is not None:
                cleaner.stop()
            cleaner = Cleaner(kafka.client_config(), topic, None, None, 7,  # type: ignore[arg-type] - never deletes
                              deleter=SegmentDeleter(7, None, None, None))  # type: ignore[arg-type]
            subscribed_at_once = Consumer({**cleaner._consumer_config, "group.id": f"g-{tag}",
                                           "group.instance.id": f"g-{tag}-7"})
            subscribed_at_once.subscribe([topic])
            cleaner.start()
            try:
                told = _errors(subscribed_at_once, 3.0)
            finally:
                subscribed_at_once.close()
            if KafkaError.UNKNOWN_TOPIC_OR_PART in told:
                break
        else:
            pytest.fail("a consumer subscribed at once was never told the new topic is unknown: no gap")
        produce(kafka, topic, [(b"k", b"not a metadata record")])  # read once subscribed: skipped, logged
        wait_for(lambda: cleaner.skipped == 1, 60, "the cleaner to read the topic")
        assert [r.getMessage() for r in caplog.records if r.name == "rlm.tasks.cleaner"] == [
            "undecodable record in the to-be-deleted topic: skipped"]
    finally:
        if cleaner is not None:
            cleaner.stop()
        admin.delete_topics(created)
