"""Spark reads the remote tier directly: the ``kafka-remote`` PySpark data source.

``register(spark)`` then ``spark.read.format("kafka-remote")``; see :mod:`rlm.spark.source` and the options in
:mod:`rlm.spark.options`.

Spark is an extra of the package (``pip install 'rlm-sidecar[spark]'``): the sidecar itself never needs it.
"""

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as err:  # pragma: no cover - exercised by tests/test_install.py in a venv without the extra
    raise ImportError(f"rlm.spark needs the 'spark' extra: pip install 'rlm-sidecar[spark]' ({err.name} is not "
                      f"installed)", name=err.name) from err

from rlm.spark.options import SparkSourceError
from rlm.spark.source import KafkaRemoteDataSource, register

__all__ = ["KafkaRemoteDataSource", "SparkSourceError", "register"]
