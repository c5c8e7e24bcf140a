"""``scrape``: Prometheus ``/metrics`` endpoints (text exposition) into ``telemetry.metrics.v1``.

:class:`Scraper` GETs each target's Prometheus text exposition (format 0.0.4) every
``ingest_scrape_interval_s``. Samples without their own timestamp get the time the scrape started;
``job`` and ``instance`` are set as Prometheus sets them (a scraped label of the same name is kept as
``exported_job``/``exported_instance``), so a scraped sample and a remote-written one look alike.
Delivery, dead letters and the loop are the pull sources' (:mod:`services.ingest.pull`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.core.errors import ConfigError
from services.ingest import normalise
from services.ingest.errors import Overloaded, RejectedInput
from services.ingest.pull import Clock, Delivery, Series, check_answer, fetch, http_client
from services.ingest.source import Option, PullSource

log = logging.getLogger(__name__)

_SCRAPE_ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"


def parse_exposition(text: str, *, scrape_ts: float, target_labels: Mapping[str, str] | None = None) -> list[Series]:
    """Parse Prometheus text exposition (format 0.0.4) into ``(labels with __name__, [(value, ts)])``.

    Args:
        text: the exposition.
        scrape_ts: timestamp (s) of samples that carry none.
        target_labels: labels set on every sample (``job``, ``instance``); a scraped label of the same
            name is renamed ``exported_<name>``, as Prometheus does with ``honor_labels: false``.

    Raises:
        RejectedInput: the text does not parse.
    """
    target_labels = target_labels or {}
    series: list[Series] = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = dict(sample.labels)
                for name, value in target_labels.items():
                    if name in labels:
                        labels[f"exported_{name}"] = labels.pop(name)
                    labels[name] = value
                labels["__name__"] = sample.name
                ts = float(sample.timestamp) if sample.timestamp is not None else scrape_ts
                series.append((labels, [(float(sample.value), ts)]))
    # prometheus_client's parser raises these on bad text; OverflowError on a 400-digit timestamp
    except (ValueError, LookupError, TypeError, ArithmeticError) as exc:
        raise RejectedInput(f"exposition does not parse: {exc or type(exc).__name__}", reason="exposition") from exc
    return series


class Scraper:
    """Scrapes Prometheus ``/metrics`` endpoints into ``telemetry.metrics.v1`` (``source="scrape"``).

    Args:
        targets: full URLs of the endpoints (``http://host:port/metrics``).
        delivery: where events and dead letters go.
        job: the ``job`` label given to every sample.
        client: HTTP client (tests pass one with a MockTransport); default: one with ``timeout_s``.
        timeout_s: per-scrape timeout.
        max_bytes: largest exposition read.
        max_samples: most samples per MetricBatch.
        clock: wall clock (seconds), for sample timestamps.

    An exporter that stamps its own samples (the simulator, a federated Prometheus) answers the same
    sample again when it is scraped faster than it updates. As Prometheus does, a sample is sent only
    when it is newer than the last one sent for its series; the repeats are counted in
    ``clustermedic_ingest_duplicates_total``. The memory is the last scrape's series of each target.
    """

    receiver = "scrape"
    max_parallel = 8

    def __init__(
        self,
        targets: Sequence[str],
        delivery: Delivery,
        *,
        job: str = "scrape",
        client: httpx.Client | None = None,
        timeout_s: float = 10.0,
        max_bytes: int = 64 * 1024 * 1024,
        max_samples: int = 1000,
        clock: Clock = time.time,
    ) -> None:
        self.targets = list(targets)
        self._delivery = delivery
        self._job = job
        self._client = client or http_client(timeout_s)
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._max_samples = max_samples
        self._clock = clock
        self._last_ts: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}

    def poll(self) -> int:
        """Scrape every target once, several at a time; return how many samples Kafka acknowledged.

        Targets are scraped concurrently (at most :attr:`max_parallel` at once) so that one slow target
        does not delay the others' samples, as each Prometheus scrape loop runs on its own.
        """
        if len(self.targets) <= 1:
            return sum(self.scrape(target) for target in self.targets)
        with ThreadPoolExecutor(min(self.max_parallel, len(self.targets)), thread_name_prefix="scrape") as pool:
            return sum(pool.map(self.scrape, self.targets))

    def scrape(self, url: str) -> int:
        """Scrape one target and publish its samples; never raises for a bad or absent target."""
        metrics = self._delivery.metrics
        started = self._clock()
        try:
            answer = fetch(
                self._client,
                url,
                params={},
                max_bytes=self._max_bytes,
                Accept=_SCRAPE_ACCEPT,
                **{"X-Prometheus-Scrape-Timeout-Seconds": f"{self._timeout_s:g}"},
            )
        except httpx.HTTPError as exc:
            log.warning("scrape %s: cannot fetch: %s", url, exc or type(exc).__name__)
            metrics.requests.labels(self.receiver, "unreachable").inc()
            return 0
        metrics.requests.labels(self.receiver, str(answer.status)).inc()
        try:
            check_answer(answer, f"scrape {url}", self._max_bytes)
            media = answer.content_type.partition(";")[0].strip().lower()
            if media not in ("", "text/plain"):
                raise RejectedInput(
                    f"scrape {url}: Content-Type {answer.content_type!r}: the scraper reads the text format "
                    "(text/plain; version=0.0.4)",
                    reason="media_type",
                )
            try:
                text = answer.body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RejectedInput(f"scrape {url}: exposition is not UTF-8: {exc}", reason="exposition") from exc
            try:
                series = parse_exposition(
                    text, scrape_ts=started, target_labels={"job": self._job, "instance": urlsplit(url).netloc}
                )
            except RejectedInput as exc:
                raise RejectedInput(f"scrape {url}: {exc}", reason=exc.reason) from exc
        except RejectedInput as exc:
            self._delivery.deadletter(
                receiver=self.receiver, source=f"scrape:{url}", key=url, raw=answer.body, error=exc
            )
            return 0
        series, seen, repeated = self._newer_only(url, series)
        if repeated:
            metrics.duplicates.labels(self.receiver).inc(repeated)
        check = self._delivery.time_check(started)
        batches, dropped = normalise.metric_batches(series, source="scrape", max_samples=self._max_samples, check=check)
        try:
            self._delivery.publish(batches)
        except Overloaded as exc:
            log.warning("scrape %s: not published, retried next scrape: %s", url, exc)
            metrics.throttled.labels(self.receiver).inc()
            return 0
        self._last_ts[url] = seen  # only once Kafka has them: a throttled scrape is sent again next time
        accepted = sum(len(b.samples) for b in batches)
        self._delivery.refused(
            check, receiver=self.receiver, source=f"scrape:{url}", key=url, total=len(series), what="samples"
        )
        metrics.received.labels(self.receiver).inc(accepted)
        if dropped:
            metrics.dropped.labels(self.receiver).inc(dropped)
        return accepted

    def _newer_only(
        self, url: str, series: list[Series]
    ) -> tuple[list[Series], dict[tuple[tuple[str, str], ...], float], int]:
        """Each series' samples newer than the last one sent, the newest timestamps, and the repeats."""
        before = self._last_ts.get(url, {})
        now: dict[tuple[tuple[str, str], ...], float] = {}
        kept: list[Series] = []
        repeated = 0
        for labels, samples in series:
            key = tuple(sorted(labels.items()))
            last = before.get(key, -math.inf)
            fresh = [(value, ts) for value, ts in samples if ts > last]
            repeated += len(samples) - len(fresh)
            now[key] = max([last, *(ts for _, ts in samples)])
            if fresh:
                kept.append((labels, fresh))
        return kept, now, repeated


class ScrapeSource(PullSource):
    """``medic ingest scrape``: a :class:`Scraper` over ``ingest_scrape_targets``."""

    name = "scrape"
    command = "scrape"
    summary = "Scrape Prometheus /metrics endpoints (text format) into telemetry.metrics.v1."
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "target",
            list[str],
            "ingest_scrape_targets",
            "URL of a /metrics endpoint; repeat for several (default: ingest_scrape_targets).",
        ),
        Option(
            "interval",
            float,
            "ingest_scrape_interval_s",
            "Seconds between scrapes (default: ingest_scrape_interval_s).",
        ),
        Option("job", str, "ingest_scrape_job", "job label of scraped samples (default: ingest_scrape_job)."),
    )

    def check(self) -> None:
        if not self.settings.ingest_scrape_targets:
            raise ConfigError("no targets: pass --target URL or set CLUSTERMEDIC_INGEST_SCRAPE_TARGETS")

    @property
    def interval_s(self) -> float:
        return self.settings.ingest_scrape_interval_s

    def build(self, delivery: Delivery) -> Scraper:
        settings = self.settings
        return Scraper(
            settings.ingest_scrape_targets,
            delivery,
            job=settings.ingest_scrape_job,
            timeout_s=min(settings.ingest_scrape_interval_s, 10.0),
            max_bytes=settings.ingest_max_decompressed_bytes,
            max_samples=settings.ingest_max_samples_per_batch,
        )
