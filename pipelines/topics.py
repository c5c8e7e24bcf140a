"""Every Kafka topic of the pipeline, declared once.

Values and keys travel as raw bytes; agents decode them into the pydantic models of
``services.core.events`` themselves, so an undecodable message can be dead-lettered instead of
crashing the agent inside Faust's deserialiser.
"""

from __future__ import annotations

from dataclasses import dataclass

import faust
from faust.types import TopicT

from services.core import events
from services.core.settings import Settings


@dataclass(frozen=True)
class Topics:
    """The declared topics of one Faust app."""

    metrics: TopicT
    logs: TopicT
    events: TopicT
    anomalies: TopicT
    incidents: TopicT
    diagnoses: TopicT
    remediations: TopicT
    deadletter: TopicT

    def by_base_name(self) -> dict[str, TopicT]:
        """Map base topic names (``telemetry.metrics.v1``) to the declared topics."""
        return {
            events.MetricBatch.topic: self.metrics,
            events.LogRecord.topic: self.logs,
            events.KubeEvent.topic: self.events,
            events.Anomaly.topic: self.anomalies,
            events.IncidentEvent.topic: self.incidents,
            events.Diagnosis.topic: self.diagnoses,
            events.RemediationEvent.topic: self.remediations,
            events.DeadLetter.topic: self.deadletter,
        }


def declare_topics(app: faust.App, settings: Settings) -> Topics:
    """Declare each topic on ``app`` with the one partition count of the pipeline."""

    def declare(cls: type[events.Event]) -> TopicT:
        return app.topic(
            settings.topic(cls.topic),
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=settings.kafka_partitions,
        )

    return Topics(
        metrics=declare(events.MetricBatch),
        logs=declare(events.LogRecord),
        events=declare(events.KubeEvent),
        anomalies=declare(events.Anomaly),
        incidents=declare(events.IncidentEvent),
        diagnoses=declare(events.Diagnosis),
        remediations=declare(events.RemediationEvent),
        deadletter=declare(events.DeadLetter),
    )
