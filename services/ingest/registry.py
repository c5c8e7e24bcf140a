"""The ingest-source registry: one line per source we poll, loaded lazily (see services.core.registry).

Each source declares its command, options and client on its :class:`~services.ingest.source.PullSource`
class; ``medic ingest`` builds one command per entry (:func:`services.ingest.cli.source_command`). An
installed package adds one with an entry point in the group ``clustermedic.ingest_sources``.
"""

from __future__ import annotations

from services.core.registry import Registry
from services.ingest.source import PullSource

SOURCES: Registry[type[PullSource]] = Registry(
    "ingest source",
    {
        "scrape": "services.ingest.sources.scrape:ScrapeSource",
        "prometheus": "services.ingest.sources.prometheus:PrometheusSource",
        "loki": "services.ingest.sources.loki:LokiSource",
    },
    base=PullSource,
)
