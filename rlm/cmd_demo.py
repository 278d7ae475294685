"""``rlm demo``: a local Kafka broker, a topic with small segments, data produced, rolled segments shown."""

from __future__ import annotations

import argparse
import json
import time

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="start a local broker, produce data to a small-segment topic, show its segments")
    p.add_argument("--records", type=int, default=20_000, help="records to produce (default 20000)")
    p.add_argument("--topic", default="demo-events", help="topic name (default demo-events)")
    p.add_argument("--keep", action="store_true", help="leave the broker running until Ctrl-C")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import Producer

    from rlm.devkafka import KafkaCluster
    from rsm.log.partition import PartitionDir

    print("demo: starting a local Kafka broker (KRaft) on 127.0.0.1 ...", flush=True)
    with KafkaCluster(brokers=1) as kc:
        print(f"demo: broker up at {kc.bootstrap_servers}, log dir {kc.log_dir()}", flush=True)
        topic_id = kc.create_topic(args.topic, 1, config={"segment.ms": "1000", "compression.type": "producer"})
        print(f"demo: created topic {args.topic} (id {topic_id}) with segment.ms=1000", flush=True)
        producer = Producer({"bootstrap.servers": kc.bootstrap_servers, "compression.type": "zstd",
                             "linger.ms": 20})
        t0 = time.monotonic()
        for i in range(args.records):
            while True:
                try:
                    producer.produce(args.topic, key=f"user-{i % 97}".encode(),
                                     value=json.dumps({"seq": i, "at": time.time()}).encode())
                    break
                except BufferError:
                    producer.poll(0.05)
            if i % 2000 == 1999:
                producer.flush()
                time.sleep(0.4)  # let segment.ms pass so the broker rolls segments
        producer.flush()
        print(f"demo: produced {args.records} records in {time.monotonic() - t0:.1f}s", flush=True)
        pdir = PartitionDir(kc.log_dir() / f"{args.topic}-0")
        print(f"demo: {pdir.path} (topic id {pdir.topic_id})")
        for seg in pdir.segments():
            state = "active" if seg.is_active else "rolled"
            print(f"  {seg.base_offset:>20}  {state:6}  {seg.log_path.stat().st_size:>10} bytes")
        if args.keep:
            print("demo: broker left running; Ctrl-C to stop", flush=True)
            try:
                while True:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
    return 0
