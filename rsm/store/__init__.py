"""Object stores for remote segments: the :class:`~rsm.store.base.Store` protocol, filesystem and S3."""

__all__: list[str] = []
