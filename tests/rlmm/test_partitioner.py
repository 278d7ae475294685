"""The metadata partition of a user partition, proved against Kafka's RemoteLogMetadataTopicPartitioner."""

from __future__ import annotations

import random
import uuid

from rlmm.partitioner import metadata_partition, murmur2


def test_matches_kafkas_partitioner(kafka_probe) -> None:
    rnd = random.Random(2024)
    cases = [(uuid.UUID(int=rnd.getrandbits(128)), rnd.choice([0, 1, 7, rnd.randrange(2**31)]),
              rnd.choice([1, 3, 50, 64, 97])) for _ in range(300)]
    cases += [(uuid.UUID(int=0), 0, 50), (uuid.UUID(int=2**128 - 1), 2**31 - 1, 50)]
    lines = kafka_probe.run([f"P {u.hex} {p} {n}" for u, p, n in cases])
    assert [int(x) for x in lines] == [metadata_partition(u, p, n) for u, p, n in cases]
    assert len({metadata_partition(u, p, 50) for u, p, _n in cases}) > 40   # spreads over the partitions


def test_murmur2_matches_kafka(kafka_probe) -> None:
    rnd = random.Random(7)
    data = [b"", b"a", b"ab", b"abc", b"21", b"foobar", *(rnd.randbytes(rnd.randrange(1, 40)) for _ in range(50))]
    lines = kafka_probe.run([f"M {d.hex()}" for d in data])
    assert [int(x) for x in lines] == [murmur2(d) for d in data]
