"""The proxy's side towards the broker: one connection per client connection (:mod:`.brokers`), the broker
addresses in answers replaced by the sidecars' (:mod:`.rewrite`), which clients' requests may be forwarded at all
(:mod:`.hosts`: host-based ACLs), and the proxied routes (:mod:`.proxy`)."""
