"""What the listener answers from the remote tier, one module per concern, as version-independent values.

Each answer takes the decoded request (a kio entity of whatever version the client sent) and returns a dict named
as the response schema's fields; :func:`rlm.listener.protocol.codec.build` keeps what the version has (topic names
before Fetch v13, topic ids from it, and so on). Answers block (they read the store): the server runs them on its
worker threads. A partition's remote chain, bounds and fetches are the tier's read model (:class:`rlm.tier.TierView`),
as every other reader's.

- :mod:`.context`: what every answer shares (served topics, the tier, the cluster's ACLs, unreadable copies);
- :mod:`.catalog`: which topics are served (the cluster's tiered topics);
- :mod:`.node`: the history endpoint as one node (ApiVersions, Metadata, DescribeCluster, FindCoordinator, Produce);
- :mod:`.offsets`: ListOffsets; :mod:`.fetch`: Fetch; :mod:`.polls`: Fetches waiting for the tier to grow.
"""
