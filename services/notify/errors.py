"""Errors of the notify service.

A notifier's failure says whether trying again can help; the Celery task retries only what can::

    ClusterMedicError
    └── NotifyError                 anything that went wrong delivering a notification
        ├── RetryableDelivery       429, 5xx, timeouts, connection errors, Slack ``ratelimited``:
        │                           try again later (after ``retry_after`` seconds when the vendor said)
        └── PermanentDelivery       any other 4xx, a vendor-level rejection: the same request fails again
            ├── PayloadTooLarge     still over the vendor's size limit after truncation
            └── NotifierConfigError the receiver config cannot work (no URL, unreadable secret file)
"""

from __future__ import annotations

from services.core.errors import ClusterMedicError


class NotifyError(ClusterMedicError):
    """Root of the notify service's errors.

    Args:
        message: what happened, for logs and the delivery record.
        status_code: the HTTP status the vendor answered, when there was an answer.
    """

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class RetryableDelivery(NotifyError):
    """The delivery may succeed later: rate limited, vendor error, network trouble.

    Args:
        message: what happened.
        status_code: the vendor's HTTP status, if any.
        retry_after: seconds the vendor asked us to wait (``Retry-After``), if it said.
    """

    def __init__(self, message: str, *, status_code: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, status_code=status_code)
        self.retry_after = retry_after


class PermanentDelivery(NotifyError):
    """The vendor refused the request for a reason that retrying does not change."""


class PayloadTooLarge(PermanentDelivery):
    """The payload is over the vendor's limit even after truncating it."""


class NotifierConfigError(PermanentDelivery):
    """A receiver's notifier config is unusable (missing URL or key, unreadable secret file)."""
