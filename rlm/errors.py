"""The errors the sidecar's own code raises: every one derives from :class:`RlmError`.

Errors of the packages it uses keep their own roots (:class:`rsm.errors.RemoteStorageError`,
:class:`rlmm.api.RemoteLogMetadataError`) and pass through ``rlm`` as they are.
"""

from __future__ import annotations

__all__ = ["DeleteQueueError", "RlmError"]


class RlmError(Exception):
    """The root of ``rlm``'s errors."""


class DeleteQueueError(RlmError):
    """A delete the store refused could not be written to the to-be-deleted topic (so the cleaner will not retry
    it; the segment stays DELETE_SEGMENT_STARTED, and the copy task's clean-up deletes it again)."""
