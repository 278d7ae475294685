"""The suite's shared fixtures are a plugin, ``tests/support/fixtures.py`` (the real broker, clusters, S3 servers,
topic names); the principals of the secured clusters are named there too. ``tests/support/ordering.py`` orders the
modules handed to pytest-xdist's workers (slow ones first)."""

pytest_plugins = ("tests.support.fixtures", "tests.support.ordering")
