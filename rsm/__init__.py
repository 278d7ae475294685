"""RemoteStorageManager: where segment bytes live (Kafka's on-disk format in :mod:`rsm.log`, remote objects,
filesystem and S3 stores). Imports never flow from here to ``rlm`` or ``rlmm``.

Public to other packages: :mod:`rsm.api` (the interface, its value types and the read interface
:class:`~rsm.api.SegmentHandle`), :mod:`rsm.manager` (the implementation and its configuration), :mod:`rsm.errors`,
:mod:`rsm.throttle`, :mod:`rsm.verify` and :mod:`rsm.log` (Kafka's on-disk format, for the copier and staging).
The remote object format (:mod:`rsm.format`) and the stores (:mod:`rsm.store`) are internal: ``tests/test_layering.py``
keeps ``rlm`` off them."""

__all__: list[str] = []
