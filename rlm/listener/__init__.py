"""The sidecar's Kafka listener: the remote tier served over the Kafka protocol, so any Kafka client reads history.

Point ``bootstrap.servers`` at the endpoint and ``assign()`` partitions (the topics the cluster's ACLs let the
client's principal read, :mod:`~rlm.listener.authz`): ApiVersions, Metadata (the tiered topics,
this endpoint leading every partition), DescribeCluster, ListOffsets (earliest / latest / by timestamp / max
timestamp, from the remote tier) and Fetch (record batches as stored, read_committed with the aborted
transactions of the uploaded transaction indexes, long polls at the tier's end) are served. Consumer groups are
not: FindCoordinator answers COORDINATOR_NOT_AVAILABLE. With ``history_listener.proxy`` the listener proxies the
broker the sidecar runs next to instead (consumer groups included), answering from the tier only what lies below
the broker's log start (:mod:`rlm.listener.routing`).

Layers, each a package or module of its own (this module only wires them, :func:`start_listener`)::

    protocol/   apis.py (the api keys we know), frame.py (size prefix, headers), codec.py (kio bodies)
    net/        server.py (asyncio, per-connection order, bounds), tls.py, sasl.py, principals.py (who a client is)
    authz.py    the cluster's ACLs for the client's principal
    routing.py  the one table: api key -> who answers it (here, forwarded, rewritten, split)
    upstream/   as a proxy: brokers.py (a connection per client to the broker), rewrite.py (broker addresses ->
                the sidecars'), hosts.py (which clients may be forwarded: host-based ACLs), proxy.py (the
                forwarded, rewritten and split routes)
    tier/       the answers from the tier: catalog (served topics), node, offsets, fetch, polls (long polls),
                boundary (as a proxy: what lies below the broker's log start)

A partition's remote chain, bounds and fetches are the tier's read model (:class:`rlm.tier.TierView`), as every
other reader's: this package holds only the protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlm.config import ConfigError, SidecarSettings, is_loopback
from rlm.discovery import ClusterView
from rlm.listener.authz import Authorizer
from rlm.listener.net.principals import PrincipalMapper
from rlm.listener.net.sasl import PLAIN, SaslAuthenticator, SaslPassThrough
from rlm.listener.net.server import ConnectionLimits, ListenerServer
from rlm.listener.net.tls import server_ssl_context, upstream_ssl_context
from rlm.listener.routing import Router
from rlm.listener.tier.boundary import Holes
from rlm.listener.tier.catalog import Catalog
from rlm.listener.tier.context import TierContext, reads_wait_on_network
from rlm.listener.tier.node import NodeAnswers, NodeInfo
from rlm.listener.upstream.brokers import UpstreamError, broker_address
from rlm.listener.upstream.proxy import Proxy
from rlm.listener.upstream.rewrite import PeerAddresses
from rlm.logs import limited_logger
from rlm.rlmm_config import make_rlmm
from rlm.tier import RemoteReader, TierView
from rlmm.api import RemoteLogMetadataManager, TopicIdPartition
from rsm.api import RemoteStorageManagerApi

__all__ = ["Listener", "start_listener"]

log = limited_logger(__name__)


@dataclass
class Listener:
    server: ListenerServer
    catalog: Catalog
    authorizer: Authorizer
    rlmm: RemoteLogMetadataManager
    owns_rlmm: bool

    @property
    def port(self) -> int:
        return self.server.port

    def stop(self) -> None:
        self.server.stop()
        self.catalog.stop()
        self.authorizer.stop()
        if self.owns_rlmm:
            self.rlmm.close()


def start_listener(settings: SidecarSettings, rsm: RemoteStorageManagerApi, *,
                  rlmm: RemoteLogMetadataManager | None = None,
                  staged: Callable[[TopicIdPartition], list[tuple[int, int]]] | None = None) -> Listener:
    """Start the endpoint of ``settings.history_listener``. It follows the metadata of every tiered topic with a
    metadata manager of its own (its cache in ``<state_dir>/history-metadata-cache``) unless one is passed.
    ``staged``: as a proxy, the offsets the sidecar next to it holds staged for tiering, per partition, ``(base, end
    inclusive)`` of each segment (``rlm serve`` passes its staging's, :func:`rlm.tasks.staging.staged_ranges`): a
    range below the broker's log start that they cover is never a hole (:class:`~rlm.listener.tier.boundary.Holes`);
    without it, such a range is a hole once met for ``hole_confirm_ms``.

    TLS (``history_listener.tls``) and SASL (``history_listener.sasl``) are set up first: a certificate that cannot
    be loaded or a password SCRAM cannot use raises :class:`~rlm.config.ConfigError` before anything starts."""
    cfg = settings.history_listener
    if cfg is None:
        raise ValueError("history_listener is not configured")
    ssl_context = server_ssl_context(cfg.tls) if cfg.tls is not None else None
    sasl: SaslAuthenticator | SaslPassThrough | None = None
    if cfg.sasl is not None and not cfg.proxy:  # as a proxy: passed through to the broker (below)
        sasl = SaslAuthenticator(cfg.sasl, failed_authentication_delay_s=cfg.connection_failed_authentication_delay_ms
                                 / 1000)
    if cfg.sasl is not None and PLAIN in cfg.sasl.mechanisms and ssl_context is None and not is_loopback(cfg.host):
        # Refused by the settings unless allow_sasl_plain_without_tls says so: said at every start.
        log.warning("history endpoint: SASL PLAIN without TLS sends passwords in clear text over the network "
                    "(history_listener.allow_sasl_plain_without_tls): configure history_listener.tls, or offer "
                    "SCRAM-SHA-512 only", extra={"host": cfg.host})
    # As a proxy: the broker it forwards to, found before anything starts (a ConfigError when it cannot be).
    upstream = (cfg.upstream or _upstream_of(settings)) if cfg.proxy else None
    owns = rlmm is None
    if rlmm is None:
        settings.metadata.state_dir.mkdir(parents=True, exist_ok=True)
        rlmm = make_rlmm(settings, serve_all=True, cache_for="history",
                         read_only=True)
    view = ClusterView(settings.kafka.client_config())
    catalog = Catalog(view, rlmm, settings.topics.tiered,
                      interval_s=settings.tasks.discovery_interval_ms / 1000).start()
    # The cluster's ACLs, fetched (by DescribeAcls, as the sidecar's principal) before the first client connects.
    authorizer = Authorizer.of_cluster(settings.kafka.client_config(), cfg.authorization).start()
    ctx = TierContext(catalog, TierView(RemoteReader(rlmm, rsm)), authorizer, fetch_max_bytes=cfg.fetch_max_bytes,
                      parallel_reads=reads_wait_on_network(rsm))
    node = NodeAnswers(ctx, NodeInfo(settings.broker_id, cfg.advertised, cfg.port, view.cluster_id()),
                       sasl=cfg.sasl is not None)
    proxy = None
    if upstream is not None:
        peers = PeerAddresses(settings.broker_id, lambda: (cfg.advertised, server.port), cfg.peers,
                              template=cfg.peer_address)
        proxy = Proxy(ctx, peers, upstream, timeout_s=cfg.connections_max_idle_ms / 1000,
                      max_response_bytes=cfg.queued_max_response_bytes,
                      ssl_context=upstream_ssl_context(cfg.upstream_tls) if cfg.upstream_tls is not None else None)
        # A range below the broker's log start is a hole once nothing staged for tiering covers it (the sidecar's
        # staging areas, read only) and it has been met for hole_confirm_ms (rlm.listener.tier.boundary).
        proxy.holes = Holes(cfg.hole_confirm_ms / 1000, staged)
        if cfg.sasl is not None:  # the broker authenticates each client, through the proxy, which then checks
            # that the broker would judge the client's requests as from its own address (host-based ACLs)
            sasl = SaslPassThrough(cfg.sasl, proxy.hosts.refused)
    server = ListenerServer(Router(ctx, node, proxy=proxy), cfg.host, cfg.port, workers=cfg.workers,
                            poll_s=cfg.fetch_poll_ms / 1000,
                            ssl_context=ssl_context, session_factory=sasl.session if sasl is not None else None,
                            limits=ConnectionLimits.of(cfg),
                            principal_mapper=PrincipalMapper(cfg.tls.principal_mapping_rules) if cfg.tls else None)
    try:
        server.start()
    except BaseException:
        catalog.stop()
        authorizer.stop()
        if owns:
            rlmm.close()
        raise
    if cfg.port == 0:  # tell clients the port actually bound
        node.node = NodeInfo(node.node.node_id, node.node.host, server.port, node.node.cluster_id)
    log.info("history endpoint listening", extra={"host": cfg.host, "port": server.port,
                                                  "proxy": proxy.upstream if proxy is not None else None,
                                                  "upstream_security_protocol": cfg.upstream_security_protocol
                                                  if proxy is not None else None,
                                                  "advertised": f"{cfg.advertised}:{server.port}",
                                                  "security_protocol": cfg.security_protocol,
                                                  "sasl_mechanisms": list(sasl.mechanisms) if sasl else [],
                                                  "client_certificates": bool(cfg.tls and cfg.tls.client_auth),
                                                  "topics": len(catalog.topics())})
    return Listener(server, catalog, authorizer, rlmm, owns)


def _upstream_of(settings: SidecarSettings) -> str:
    """The broker's address for the proxy: the one the cluster's metadata gives for ``broker_id``, when the
    sidecar's own client speaks what the proxy speaks to the broker (``upstream_security_protocol``: its listener is
    then the one the proxy forwards to)."""
    cfg = settings.history_listener
    assert cfg is not None
    protocol = str(settings.kafka.client.get("security.protocol", "PLAINTEXT")).upper()
    if protocol != cfg.upstream_security_protocol:
        raise ConfigError(f"history_listener.proxy: the sidecar's Kafka client speaks {protocol}, the proxy "
                          f"{cfg.upstream_security_protocol} (history_listener.sasl, upstream_tls); set "
                          "history_listener.upstream to the host:port of the broker's listener that speaks it")
    try:
        host, port = broker_address(settings.kafka.client_config(), settings.broker_id)
    except UpstreamError as err:
        raise ConfigError(f"history_listener.proxy: {err}") from err
    return f"{host}:{port}"
