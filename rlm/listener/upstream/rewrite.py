"""Broker addresses in the broker's answers replaced by the sidecars' in front of them.

A client of the proxy must come back to a proxy for every broker: the brokers listed by Metadata and
DescribeCluster, the coordinator FindCoordinator names, and the leaders a Fetch or a Produce answer names when
leadership moved (``node_endpoints``, KIP-951: Fetch v16+, Produce v10+, with each partition answered
NOT_LEADER_OR_FOLLOWER) each get the listener address of the sidecar next to that broker:

- this sidecar's broker (``broker_id``): this listener's advertised host and port;
- a broker named in ``history_listener.peers`` (node id -> host:port): that address;
- else, with ``history_listener.peer_address`` (a template of ``{node_id}`` and ``{host}``, the broker's advertised
  host): the template filled in, e.g. ``{host}:9095`` when every sidecar listens on 9095 beside its broker;
- else the broker's own address, unchanged, logged once per broker: the client then reads that broker directly
  (live data only, no history), and that broker's own Metadata answers give it every broker's own address, this
  one's included: it may then read any broker directly, where an offset below the log start is OFFSET_OUT_OF_RANGE
  (a consumer group sent back to ``auto.offset.reset``). A client of a consumer group connects to its coordinator
  and asks any broker it is connected to for metadata: every broker needs a sidecar address.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import Any

from rlm.config import split_host_port
from rlm.logs import limited_logger

__all__ = ["PeerAddresses"]

log = limited_logger(__name__)


class PeerAddresses:
    """Which listener address stands for which broker (thread-safe: answers are rewritten on workers)."""

    def __init__(self, node_id: int, own: Callable[[], tuple[str, int]], peers: Mapping[int, str], *,
                 template: str | None = None) -> None:
        self.node_id = node_id
        self.own = own  # called each time: a listener bound to port 0 learns its port once it listens
        self.peers = {n: split_host_port(a) for n, a in peers.items()}
        self.template = template
        self._unmapped: set[int] = set()
        self._lock = threading.Lock()

    def of(self, node_id: int, broker_host: str, broker_port: int) -> tuple[str, int]:
        """The address a client is told for broker ``node_id`` (advertised at ``broker_host:broker_port``)."""
        if node_id == self.node_id:
            return self.own()
        if node_id in self.peers:
            return self.peers[node_id]
        if self.template is not None:
            return split_host_port(self.template.format(node_id=node_id, host=broker_host))
        with self._lock:
            new = node_id not in self._unmapped
            self._unmapped.add(node_id)
        if new:
            log.warning("proxy: no sidecar address for broker %d (history_listener.peers / peer_address): clients "
                        "are told the broker's own address and read it directly, without history; its Metadata "
                        "then gives them every broker's own address, this one's included", node_id,
                        extra={"node_id": node_id, "broker": f"{broker_host}:{broker_port}"})
        return broker_host, broker_port

    # ------------------------------------------------------------------------------------------ answers
    def _moved(self, entity: Any, id_field: str) -> Any:
        node_id = getattr(entity, id_field)
        if node_id < 0:  # no node (an error answer)
            return entity
        host, port = self.of(node_id, entity.host, entity.port)
        return dataclasses.replace(entity, host=host, port=port)

    def metadata(self, body: Any) -> Any:
        return dataclasses.replace(body, brokers=tuple(self._moved(b, "node_id") for b in body.brokers))

    def describe_cluster(self, body: Any) -> Any:
        return dataclasses.replace(body, brokers=tuple(self._moved(b, "broker_id") for b in body.brokers))

    def find_coordinator(self, body: Any) -> Any:
        coordinators = getattr(body, "coordinators", None)
        if coordinators is not None:  # v4+: one per key
            return dataclasses.replace(body, coordinators=tuple(self._moved(c, "node_id") for c in coordinators))
        return self._moved(body, "node_id")

    def leaders(self, body: Any) -> Any:
        """A Fetch or Produce answer with its ``node_endpoints`` moved (the ``current_leader`` of its partitions
        names only node ids and epochs: left as the broker's)."""
        endpoints = getattr(body, "node_endpoints", None)
        if not endpoints:
            return body
        return dataclasses.replace(body, node_endpoints=tuple(self._moved(e, "node_id") for e in endpoints))
