"""The anomaly history the correlate role writes: what is waiting for the next batch, and when to prune.

The correlate role is the one writer of the ``anomalies`` table (``services/store/anomalies.py``),
which the diagnostician's evidence tools read. It consumes every anomaly already, in order, with
acks that wait for a checkpoint; so each decoded anomaly joins the pending batch here, and the batch
is written when it is full and at every checkpoint, before the events that carried it are acked. A
worker killed before that re-reads those events after its restart and writes them again (the upsert
is idempotent), so nothing valid is lost.

Retention follows event time, like every timer in the pipeline: rows older than the role's clock
minus ``anomaly_retention_s`` are deleted, at most once per ``prune_every_s`` of that clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.alerting.labels import alert_fingerprint
from services.core.events import Anomaly


@dataclass
class AnomalyHistory:
    """Anomalies consumed and not yet stored, and the event time of the last prune; no I/O.

    Attributes:
        retention_s: how long (event time) a stored anomaly is kept.
        batch_size: write as soon as this many anomalies are waiting.
        prune_every_s: least event time between two prunes.
    """

    retention_s: float
    batch_size: int = 500
    prune_every_s: float = 3600.0
    _pending: list[Anomaly] = field(default_factory=list)
    _pruned_at: float | None = None

    def add(self, anomaly: Anomaly) -> None:
        """Queue one anomaly, stamped with its alert's fingerprint (the key the evidence tools look up)."""
        fp = alert_fingerprint(anomaly)
        self._pending.append(anomaly if anomaly.fingerprint == fp else anomaly.model_copy(update={"fingerprint": fp}))

    def __len__(self) -> int:
        return len(self._pending)

    def full(self) -> bool:
        """Whether a batch is ready to be written now rather than at the next checkpoint."""
        return len(self._pending) >= self.batch_size

    def take(self) -> list[Anomaly]:
        """Hand over every pending anomaly (oldest first) and forget them."""
        batch, self._pending = self._pending, []
        return batch

    def prune_before(self, now: float | None) -> float | None:
        """The time before which stored anomalies are to be deleted now, or None when no prune is due.

        Args:
            now: the role's event time (None before it has seen any event).
        """
        if now is None:
            return None
        if self._pruned_at is not None and now - self._pruned_at < self.prune_every_s:
            return None
        self._pruned_at = now
        return now - self.retention_s
