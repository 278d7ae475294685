"""The history endpoint: the remote tier served over the Kafka protocol, so any Kafka client reads history.

Point ``bootstrap.servers`` at the endpoint and ``assign()`` partitions (the topics the cluster's ACLs let the
client's principal read, :mod:`~rlm.history.acls`): ApiVersions, Metadata (the tiered topics,
this endpoint leading every partition), DescribeCluster, ListOffsets (earliest / latest / by timestamp / max
timestamp, from the remote tier) and Fetch (record batches as stored, read_committed with the aborted
transactions of the uploaded transaction indexes, long polls at the tier's end) are served. Consumer groups are
not: FindCoordinator answers COORDINATOR_NOT_AVAILABLE.

Modules: :mod:`~rlm.history.wire` (framing and codecs, by kio), :mod:`~rlm.history.handlers` (one method per API),
:mod:`~rlm.history.catalog` (which topics are served), :mod:`~rlm.history.server` (asyncio socket server),
:mod:`~rlm.history.security` (TLS, and SASL PLAIN / SCRAM-SHA-512 with users from the config),
:mod:`~rlm.history.principals` (who a client is: SASL user, certificate subject), :mod:`~rlm.history.acls` (the
cluster's ACLs applied to it). A partition's remote chain, bounds and fetches are the tier's read model
(:class:`rlm.tier.TierView`), as every other reader's: this package holds only the protocol.
:func:`start_history` puts them together for ``rlm serve``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rlm.config import SidecarSettings, is_loopback
from rlm.discovery import ClusterView
from rlm.history.acls import Authorizer
from rlm.history.catalog import Catalog
from rlm.history.handlers import Handlers, NodeInfo
from rlm.history.principals import PrincipalMapper
from rlm.history.security import PLAIN, SaslAuthenticator, server_ssl_context
from rlm.history.server import ConnectionLimits, HistoryServer
from rlm.rlmm_config import make_rlmm
from rlm.tier import RemoteReader, TierView
from rlmm.api import RemoteLogMetadataManager
from rsm.api import RemoteStorageManagerApi

__all__ = ["History", "start_history"]

log = logging.getLogger(__name__)


@dataclass
class History:
    server: HistoryServer
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


def start_history(settings: SidecarSettings, rsm: RemoteStorageManagerApi, *,
                  rlmm: RemoteLogMetadataManager | None = None) -> History:
    """Start the endpoint of ``settings.history_listener``. It follows the metadata of every tiered topic with a
    metadata manager of its own (its cache in ``<state_dir>/history-metadata-cache``) unless one is passed.

    TLS (``history_listener.tls``) and SASL (``history_listener.sasl``) are set up first: a certificate that cannot
    be loaded or a password SCRAM cannot use raises :class:`~rlm.config.ConfigError` before anything starts."""
    cfg = settings.history_listener
    if cfg is None:
        raise ValueError("history_listener is not configured")
    ssl_context = server_ssl_context(cfg.tls) if cfg.tls is not None else None
    sasl = SaslAuthenticator(cfg.sasl, failed_authentication_delay_s=cfg.connection_failed_authentication_delay_ms
                             / 1000) if cfg.sasl is not None else None
    if sasl is not None and PLAIN in sasl.mechanisms and ssl_context is None and not is_loopback(cfg.host):
        # Refused by the settings unless allow_sasl_plain_without_tls says so: said at every start.
        log.warning("history endpoint: SASL PLAIN without TLS sends passwords in clear text over the network "
                    "(history_listener.allow_sasl_plain_without_tls): configure history_listener.tls, or offer "
                    "SCRAM-SHA-512 only", extra={"host": cfg.host})
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
    tier = TierView(RemoteReader(rlmm, rsm))
    handlers = Handlers(catalog, tier, NodeInfo(settings.broker_id, cfg.advertised, cfg.port, view.cluster_id()),
                        authorizer, sasl=sasl is not None, fetch_max_bytes=cfg.fetch_max_bytes)
    server = HistoryServer(handlers, cfg.host, cfg.port, workers=cfg.workers, poll_s=cfg.fetch_poll_ms / 1000,
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
        handlers.node = NodeInfo(handlers.node.node_id, handlers.node.host, server.port, handlers.node.cluster_id)
    log.info("history endpoint listening", extra={"host": cfg.host, "port": server.port,
                                                  "advertised": f"{cfg.advertised}:{server.port}",
                                                  "security_protocol": cfg.security_protocol,
                                                  "sasl_mechanisms": list(sasl.mechanisms) if sasl else [],
                                                  "client_certificates": bool(cfg.tls and cfg.tls.client_auth),
                                                  "topics": len(catalog.topics())})
    return History(server, catalog, authorizer, rlmm, owns)
