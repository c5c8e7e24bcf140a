"""Process-level settings of the notify service.

:class:`NotifySettings` is built at the entrypoint (the Celery worker process, a test) like
:class:`~services.core.settings.Settings`; the environment variable is the field name upper-cased with
the ``CLUSTERMEDIC_NOTIFY_`` prefix (``timeout_s`` -> ``CLUSTERMEDIC_NOTIFY_TIMEOUT_S``). What to send
where comes from the receivers of ``infra/config/routing.yaml``, carried with each task.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

SLACK_API_BASE = "https://slack.com/api"
PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"


class NotifySettings(BaseSettings):
    """Settings of the notifiers and the delivery task."""

    model_config = SettingsConfigDict(env_prefix="CLUSTERMEDIC_NOTIFY_", env_file=".env", extra="ignore")

    timeout_s: float = Field(default=10.0, gt=0, description="HTTP timeout of one delivery request.")
    dedup_ttl_s: int = Field(
        default=7 * 86400, ge=60, description="How long a delivered (or refused) notification is remembered."
    )
    claim_lease_s: int = Field(
        default=120,
        ge=5,
        description="How long a delivery in progress holds its idempotency key before a redelivery may take it.",
    )
    thread_ttl_s: int = Field(
        default=14 * 86400, ge=60, description="How long the Slack thread of an incident is remembered."
    )
    incident_ttl_s: int = Field(
        default=14 * 86400,
        ge=60,
        description="How long the notifier remembers an incident (its labels, diagnosis, remediation).",
    )
    external_url: str = Field(
        default="", description="ClusterMedic's URL, sent as externalURL and as links back to the incident."
    )
    source: str = Field(default="clustermedic", description="PagerDuty payload.source when the config has none.")
    slack_api_base: str = Field(default=SLACK_API_BASE, description="Base URL of Slack's Web API (chat.*).")
    pagerduty_url: str = Field(
        default=PAGERDUTY_EVENTS_URL, description="PagerDuty Events API v2 enqueue URL when the config has none."
    )
    key_prefix: str = Field(default="clustermedic:notify:", description="Prefix of every Redis key notify writes.")
