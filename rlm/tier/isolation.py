"""What a reader of the tier sees of transactions: Kafka's ``IsolationLevel``, one type for every reader.

Kafka names the two levels in its consumer config (``isolation.level``: ``read_uncommitted``,
``read_committed``) and numbers them in its Fetch and ListOffsets requests (``IsolationLevel => INT8``:
0 and 1; ``org.apache.kafka.common.IsolationLevel``). :class:`Isolation` is both: its values are the config
names (what the CLI's ``--isolation`` and the Spark source's ``isolation.level`` option take; a ``StrEnum``, so a
member equals its name), :attr:`Isolation.id` the wire number (what the history endpoint reads from requests,
:meth:`Isolation.from_id`).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Isolation"]


class Isolation(StrEnum):
    """``read_uncommitted``: every record but control records; ``read_committed``: the records of aborted
    transactions are dropped too, and nothing at or past the last stable offset is served."""

    READ_UNCOMMITTED = "read_uncommitted"
    READ_COMMITTED = "read_committed"

    @property
    def id(self) -> int:
        """Kafka's wire number (``isolation_level`` in Fetch and ListOffsets): 0 or 1."""
        return 1 if self is Isolation.READ_COMMITTED else 0

    @classmethod
    def from_id(cls, level: int) -> Isolation:
        """The level a request's ``isolation_level`` names: 1 is read_committed, any other number
        read_uncommitted (the endpoint has always served an unknown level as read_uncommitted)."""
        return cls.READ_COMMITTED if level == cls.READ_COMMITTED.id else cls.READ_UNCOMMITTED
