"""What pyspark pickles to the executors for a read (the data source and the reader, in the read function's
closure: ``pyspark/sql/worker/plan_data_source_read.py``) holds no Kafka secret; the driver's reader keeps them for
planning. The SASL_SSL end-to-end read is in tests/rlm/test_secure_cluster.py."""

from __future__ import annotations

from pyspark import cloudpickle

from rlm.spark.source import KafkaRemoteDataSource

PASSWORD = "hunter2-not-for-executors"


def _source() -> KafkaRemoteDataSource:
    return KafkaRemoteDataSource({
        "subscribe": "t", "kafka.bootstrap.servers": "127.0.0.1:1", "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.username": "alice", "kafka.sasl.password": PASSWORD,
        "kafka.ssl.key.password": PASSWORD + "-key", "store": "fs", "store.root_path": "/nonexistent"})


def test_batch_read_function_carries_no_kafka_secret() -> None:
    source = _source()
    reader = source.reader(None)  # type: ignore[arg-type]
    assert reader.opts.client_config["sasl.password"] == PASSWORD  # the driver plans with it
    shipped = cloudpickle.dumps((source, reader))  # what the read function's closure captures
    assert PASSWORD.encode() not in shipped
    source_back, reader_back = cloudpickle.loads(shipped)
    assert "sasl.password" not in reader_back.opts.client_config
    assert reader_back.opts.store == reader.opts.store  # executors rebuild their storage manager from this
    assert source_back.options["kafka.sasl.username"] == "alice"


def test_stream_read_function_carries_no_kafka_secret() -> None:
    source = _source()
    reader = source.streamReader(None)  # type: ignore[arg-type]
    assert reader.opts.client_config["ssl.key.password"] == PASSWORD + "-key"
    shipped = cloudpickle.dumps((source, reader))
    assert PASSWORD.encode() not in shipped
    _source_back, reader_back = cloudpickle.loads(shipped)
    assert reader_back.opts.client_config == {} and reader_back.opts.store == reader.opts.store
