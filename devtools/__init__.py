"""Development tools that live in the source checkout only: never part of the installed package.

``devtools.devkafka`` starts a real Apache Kafka cluster (KRaft) on 127.0.0.1 for the tests, ``./dev demo`` and
the benchmarks. ``pyproject.toml`` packages only ``rlm``, ``rlmm`` and ``rsm``, so ``pip install .`` (the Docker
image) leaves this folder out; ``./dev`` puts the checkout on ``PYTHONPATH`` and pytest imports it from the
repository root.
"""
