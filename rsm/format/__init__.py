"""The remote object format: data blocks, the index object and object keys (one module per byte format)."""

__all__: list[str] = []
