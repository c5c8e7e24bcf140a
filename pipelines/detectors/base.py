"""The detector contract.

A detector is pure: ``detect(batch, state) -> (state, anomalies)``. It does no I/O, reads no clock
(time comes from the events' timestamps) and keeps no globals; everything it remembers is in the state
it returns. The Faust agent owns the topics, the state tables and the clock, and scores in
micro-batches because a model call costs about the same for one row as for a thousand.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

from services.core.events import Anomaly

S = TypeVar("S")


@runtime_checkable
class Detector(Protocol):
    """What every registered detector provides.

    Attributes:
        name: the registry key, also written into ``Anomaly.detector``.
        consumes: the input type of ``detect``'s batch: ``MetricBatch``, ``LogRecord``, ``KubeEvent``
            or ``pipelines.features.FeatureVector``; the detect agent routes by it.
        signals: every ``Anomaly.signal`` it can emit. The one list of them: the signal catalog
            (:func:`pipelines.detectors.registry.signal_catalog`), which runbooks are checked against, is
            derived from it, and a unit test runs the detectors and fails on any signal not declared.
    """

    name: ClassVar[str]
    consumes: ClassVar[type]
    signals: ClassVar[frozenset[str]]

    def initial_state(self) -> Any:
        """State before any event has been seen."""
        ...

    def detect(self, batch: Sequence[Any], state: Any) -> tuple[Any, list[Anomaly]]:
        """Consume one micro-batch of events; return the new state and the anomalies found."""
        ...
