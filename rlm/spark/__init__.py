"""Spark reads the remote tier directly: the ``kafka-remote`` PySpark data source.

``register(spark)`` then ``spark.read.format("kafka-remote")``; see :mod:`rlm.spark.source` and the options in
:mod:`rlm.spark.options`.
"""

from rlm.spark.options import SparkSourceError
from rlm.spark.source import KafkaRemoteDataSource, register

__all__ = ["KafkaRemoteDataSource", "SparkSourceError", "register"]
