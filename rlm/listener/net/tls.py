"""The listener's TLS: the server context built from ``history_listener.tls``, and as a proxy the client context of its
connections to the broker (``history_listener.upstream_tls``).

With a ``cafile`` every client must present a certificate that chains to it (mutual TLS, which counts as
authentication: :mod:`rlm.listener.net.principals` names the client from its subject).
"""

from __future__ import annotations

import ssl

from rlm.config import ConfigError, HistoryTlsSettings, HistoryUpstreamTlsSettings

__all__ = ["server_ssl_context", "upstream_ssl_context"]


def server_ssl_context(tls: HistoryTlsSettings) -> ssl.SSLContext:
    """The listener's TLS context. Raises :class:`ConfigError` naming the ``history_listener.tls`` field whose file
    cannot be loaded (the operator fixes the path, the permissions or the password)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3 if tls.min_version == "TLSv1.3" else ssl.TLSVersion.TLSv1_2
    password = tls.keyfile_password.get_secret_value() if tls.keyfile_password is not None else None
    try:
        ctx.load_cert_chain(tls.certfile, tls.keyfile, password=password)
    except (OSError, ssl.SSLError) as err:
        fields = "certfile" if tls.keyfile is None else "certfile / keyfile"
        raise ConfigError(f"history_listener.tls.{fields}: cannot load the certificate or its key "
                          f"({tls.certfile}{', ' + str(tls.keyfile) if tls.keyfile else ''}): {err}") from err
    if tls.cafile is not None:
        try:
            ctx.load_verify_locations(cafile=tls.cafile)
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(f"history_listener.tls.cafile: cannot load {tls.cafile}: {err}") from err
        ctx.verify_mode = ssl.CERT_REQUIRED
    if tls.ciphers is not None:
        try:
            ctx.set_ciphers(tls.ciphers)
        except ssl.SSLError as err:
            raise ConfigError(f"history_listener.tls.ciphers: {err}") from err
    return ctx


def upstream_ssl_context(tls: HistoryUpstreamTlsSettings) -> ssl.SSLContext:
    """The proxy's TLS context towards its broker, as a Kafka client's: the broker's certificate must chain to
    ``cafile`` (the system's CAs without it) and, with ``check_hostname``, name the upstream host. Raises
    :class:`ConfigError` naming ``history_listener.upstream_tls.cafile`` when it cannot be loaded."""
    try:
        ctx = ssl.create_default_context(cafile=str(tls.cafile) if tls.cafile is not None else None)
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"history_listener.upstream_tls.cafile: cannot load {tls.cafile}: {err}") from err
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = tls.check_hostname
    return ctx
