"""Errors of the ingest service, under the project's root error.

::

    ClusterMedicError
    └── IngestError                  something the ingest service refuses or cannot do
        ├── RejectedInput            the sender's payload is wrong: 4xx, dead-lettered
        │   └── Unauthorized         missing or wrong bearer token (401)
        └── Overloaded               the publish queue is full or Kafka did not ack in time (503)

A :class:`RejectedInput` carries the HTTP status to answer and a short ``reason`` used as a metric
label; the message is what the sender reads in the response body.
"""

from __future__ import annotations

from services.core.errors import ClusterMedicError


class IngestError(ClusterMedicError):
    """Root of the ingest service's errors."""


class RejectedInput(IngestError):
    """The payload cannot be accepted; the sender must not retry it unchanged.

    Args:
        message: what is wrong, for the response body and the dead letter.
        status: the 4xx status to answer (400 malformed, 413 too large, 415 wrong media type).
        reason: a short, low-cardinality label for the rejected-payloads metric.
    """

    def __init__(self, message: str, *, status: int = 400, reason: str = "invalid") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class Unauthorized(RejectedInput):
    """The push endpoint needs a bearer token and the request did not carry the right one."""

    def __init__(self, message: str = "missing or invalid bearer token") -> None:
        super().__init__(message, status=401, reason="unauthorized")


class Overloaded(IngestError):
    """The service cannot take the payload now; the sender should retry after ``retry_after_s``.

    Args:
        message: why (queue full, Kafka slow).
        retry_after_s: seconds for the ``Retry-After`` header.
    """

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
