"""What the tests share, in one place (issue 23, item 7): never import a helper from a ``test_*.py`` module.

- :mod:`tests.support.processes`: the ``rlm`` CLI and ``rlm serve`` as their own processes, and HTTP GETs to them;
- :mod:`tests.support.txn`: transactional and plain produce with the offsets acknowledged;
- :mod:`tests.support.promql`: the shipped dashboard and alert rules, and the metric names a PromQL query selects;
- :mod:`tests.support.spark`: reading ``kafka-remote`` in batch and streaming, and what the reads must return.
"""
