"""RemoteStorageManager: where segment bytes live (Kafka's on-disk format in :mod:`rsm.log`, remote objects,
filesystem and S3 stores). Imports never flow from here to ``rlm`` or ``rlmm``."""

__all__: list[str] = []
