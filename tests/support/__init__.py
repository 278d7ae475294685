"""What the tests share, in one place (issue 23, item 7): never import a helper from a ``test_*.py`` module or a
``conftest.py`` (``tests/test_layering.py`` checks both); a package's ``conftest.py`` holds its fixtures only.

- :mod:`tests.support.fixtures`: the session fixtures, a pytest plugin (``tests/conftest.py`` loads it): the real
  broker and clusters, the S3 servers, the SparkSession, topic names;
- :mod:`tests.support.ordering`: a pytest plugin too: under xdist, the modules holding ``slow`` tests are handed out
  first;
- :mod:`tests.support.kafka`: producing to the real broker, rolling segments, finding its files (and keeping them:
  ``BrokerSegment``), its watermarks, topic configs, ACLs;
- :mod:`tests.support.clients`: confluent-kafka clients as the tests drive them (``Rec``, ``send``,
  ``consume_until``, librdkafka's debug lines);
- :mod:`tests.support.stores`: S3 clients of the test servers, fresh buckets, bit rot behind a store's back;
- :mod:`tests.support.sidecar`: a sidecar's settings against the test broker (``make_settings``; ``Sidecar`` is a
  context manager), waiting, and what is remote;
- :mod:`tests.support.batches`: the one record-batch builder, crafted partition directories and segments;
- :mod:`tests.support.stub_listener`: the listener's real server over a stub tier (no broker);
- :mod:`tests.support.history`: the history endpoint's set-up over the real broker (the listener tests' ``history``);
- :mod:`tests.support.rlmm`, :mod:`tests.support.world`: the copier's crafted world (no broker);
- :mod:`tests.support.processes`: the ``rlm`` CLI and ``rlm serve`` as their own processes, and HTTP GETs to them;
- :mod:`tests.support.txn`: transactional and plain produce with the offsets acknowledged;
- :mod:`tests.support.promql`: the shipped dashboard and alert rules, and the metric names a PromQL query selects;
- :mod:`tests.support.spark`: reading ``kafka-remote`` in batch and streaming, and what the reads must return.
"""
