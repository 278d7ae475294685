"""Which client connections the proxy may forward: those whose requests the broker judges as it would judge the
client's own, host-based ACLs included.

Kafka's ACL bindings carry a host (``kafka-acls --allow-host`` / ``--deny-host``: one address, or ``*``), and the
broker matches it against the address of the connection it reads a request from. A request the proxy forwards
comes from the proxy's address, its connection's local address (``getsockname()``), not the client's, and Kafka's
protocol has no way to pass the client's on. So through the proxy a DENY of the client's host would not apply, and
an ALLOW of the proxy's host (an operator's grant for tools run on the broker's machine) would apply to every
client of the proxy, wherever it connects from. Where that could change a decision the connection is refused
(:func:`rlm.listener.authz.forwarding_blocked`): the client's address differs from the proxy's as the broker sees
it, and the cluster's ACLs (the listener's view, refreshed every ``acl_cache_ttl_ms / 2``) hold a binding of the
client's principal or ``User:*``, on any resource, allow or deny, whose host is either address; or those ACLs
cannot be fetched (fail closed, as the tier's reads are refused then). A binding of a third host matches neither
address and changes nothing; a cluster without an authorizer has no ACLs to widen.

Checked when a SASL client's authentication succeeds (:class:`~rlm.listener.net.sasl.PassThroughSession` answers
SASL_AUTHENTICATION_FAILED instead of the broker's success, then closes), and before each client request is
forwarded, so before the proxy's own on the client's connection too (the listener closes the connection: a client
without SASL, or a binding that appeared after it authenticated). The decision is kept per connection for the
view's generation it was made in (:meth:`~rlm.listener.authz.AclCache.unchanged_since`: no refresh since, the ACLs
not expired), so a request costs two attribute reads and a clock read: 0.53-0.62 us a call against 1.16-1.41 us
asking the view's ``current()`` (its lock) and comparing (side by side, load 2), and a binding added applies to
connections already open at their first request after the listener's next refresh. Refusals are counted
(``rlm_history_proxy_refused{reason}``) and logged once per principal and address with the binding (principal,
resource, host).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from prometheus_client import Counter

from rlm.listener.authz import Acl, Authorizer, Unavailable, forwarding_blocked
from rlm.listener.upstream.brokers import Upstream
from rlm.logs import limited_logger

__all__ = ["HostCheck", "REFUSED_MESSAGE", "UNAVAILABLE_MESSAGE"]

log = limited_logger(__name__)

LOGGED = 10_000  # (principal, client address) remembered as logged
# What the client is told (its SASL error message): no binding named, the client is the principal it names
REFUSED_MESSAGE = ("Authentication failed: the cluster's ACLs name a host for this principal, and through the "
                   "proxy the broker would see the proxy's address, not yours: connect to the broker directly")
UNAVAILABLE_MESSAGE = ("Authentication failed: the proxy cannot fetch the cluster's ACLs to tell whether the broker "
                       "would judge your requests as from your own address; try again later")
REFUSED = Counter("rlm_history_proxy_refused", "As a proxy: client connections refused because the broker would "
                  "judge their requests by the proxy's address: host_acl (a binding names the client's or the "
                  "proxy's), unavailable (no ACLs to tell)", ["reason"])
_HOST_ACL, _UNAVAILABLE = REFUSED.labels("host_acl"), REFUSED.labels("unavailable")


class HostCheck:
    """The proxy's decision, per client connection (:meth:`refused`), kept on its upstream connection."""

    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer
        self._logged: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._logged_lock = threading.Lock()

    def refused(self, principal: str, host: str, upstream: Upstream) -> str | None:
        """Why ``principal``'s requests from ``host`` may not be forwarded on ``upstream`` (connected): a message for
        the client; None when they may. Counted and logged when refused (the caller closes the connection)."""
        cache = self.authorizer.cache
        decided = upstream.forwardable_in
        if decided is not None and cache.unchanged_since(decided):  # allowed for these ACLs (a refusal closes)
            return None
        generation = cache.generation  # before current(): a refresh in between is seen at the next request
        acls = cache.current()
        blocked = forwarding_blocked(acls, principal, host, upstream.local_host)
        if blocked is None:
            upstream.forwardable_in = generation
            return None
        upstream.forwardable_in = None
        if isinstance(blocked, Unavailable):
            _UNAVAILABLE.inc()
            self._log(principal, host, upstream, {"reason": "unavailable", "error": blocked.message})
            return UNAVAILABLE_MESSAGE
        _HOST_ACL.inc()
        self._log(principal, host, upstream, {"reason": "host_acl", "binding": _described(blocked)})
        return REFUSED_MESSAGE

    def _log(self, principal: str, host: str, upstream: Upstream, extra: dict[str, Any]) -> None:
        """Logged once per principal and client address (a client reconnecting would write a line per attempt)."""
        key = (principal, host)
        with self._logged_lock:
            if key in self._logged:
                return
            self._logged[key] = None
            while len(self._logged) > LOGGED:
                self._logged.popitem(last=False)
        log.warning("proxy: client connection refused: the broker would judge its requests by the proxy's address, "
                    "not the client's, and the cluster's ACLs name a host for its principal (or cannot be fetched); "
                    "such a client must connect to the broker directly (logged once per principal and address)",
                    extra={"principal": principal, "host": host, "proxy_address": upstream.local_host, **extra})


def _described(acl: Acl) -> str:
    """A binding as an operator finds it in ``kafka-acls --list``."""
    return (f"{acl.principal} {'ALLOW' if acl.allow else 'DENY'} {acl.operation} from host {acl.host} on "
            f"{acl.resource_type} {acl.pattern_type} {acl.name}")
