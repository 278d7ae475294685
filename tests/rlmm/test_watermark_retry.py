"""A metadata partition's watermarks are read again while the cluster settles (issue 9's chaos run, CI of session 8:
``_DESTROY_BROKER`` from a watermark read right after a broker restart failed an assignment outright)."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from rlmm.api import MetadataWriteError
from rlmm.cache import MetadataCache
from rlmm.topic_admin import MetadataTopic
from rlmm.topic_consumer import ConsumerTask


class _Watermarks:
    """A consumer whose watermark reads fail with ``errors`` first, then answer."""

    def __init__(self, errors: list[int]) -> None:
        self.errors = list(errors)
        self.calls = 0

    def get_watermark_offsets(self, tp, timeout=None):  # noqa: ANN001 - confluent_kafka's signature
        self.calls += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return 3, 17


def _task(tmp_path: Path, consumer: _Watermarks, timeout_s: float = 5.0) -> ConsumerTask:
    cache = MetadataCache(str(tmp_path / "cache"), topic="__rlm_md", num_partitions=2)
    task = ConsumerTask(MetadataTopic("__rlm_md", 2, 86_400_000), cache, {"bootstrap.servers": "127.0.0.1:9"},
                        caught_up_refresh_s=1.0, close_drain_s=0.0, max_batch_records=10, kafka_timeout_s=timeout_s)
    task._consumer.close()
    task._consumer = consumer
    return task


@pytest.mark.parametrize("code", [KafkaError._DESTROY_BROKER, KafkaError._TRANSPORT,
                                  KafkaError.NOT_LEADER_FOR_PARTITION])
def test_a_settling_error_is_retried(tmp_path: Path, code: int) -> None:
    consumer = _Watermarks([code, code])
    assert _task(tmp_path, consumer)._watermarks(1) == (3, 17)
    assert consumer.calls == 3


def test_a_lasting_error_fails_with_the_partition_named(tmp_path: Path) -> None:
    consumer = _Watermarks([KafkaError._DESTROY_BROKER] * 1000)
    with pytest.raises(MetadataWriteError, match=r"__rlm_md-1"):
        _task(tmp_path, consumer, timeout_s=0.5)._watermarks(1)
    assert consumer.calls > 1


def test_another_error_is_not_retried(tmp_path: Path) -> None:
    consumer = _Watermarks([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(MetadataWriteError, match="TOPIC_AUTHORIZATION_FAILED"):
        _task(tmp_path, consumer)._watermarks(0)
    assert consumer.calls == 1
